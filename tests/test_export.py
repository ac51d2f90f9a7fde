"""Estimator training and Keras-loadable exports, in process (small data).

The fresh-process checks run Python without this package on the path, so
they prove a plain Keras user can load the files.
"""

import json
import os
import re
import stat
import textwrap

import numpy as np
import pytest

import tensorflow as tf

from estimator_keras import export as export_lib
from estimator_keras import inputs, io, manifest, model_inputs, records
from estimator_keras.records import encode_example
from estimator_keras import checkpoints
from estimator_keras.engines import base, optimizers
from estimator_keras.engines.estimator import engine as est_lib
from estimator_keras.errors import ModelDirError, SchemaError
from support import fresh_python

pytestmark = pytest.mark.slow


def _image_data(n=512, seed=0):
    """A learnable 10-class problem: class k brightens row band k."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    images = rng.integers(0, 60, (n, 28, 28, 1)).astype(np.uint8)
    for i, k in enumerate(labels):
        images[i, 2 * k + 4:2 * k + 7, :, 0] += 180
    return {"image": images, "label": labels.astype(np.int64)}


def _build():
    layers = tf.keras.layers
    x_in = tf.keras.Input((28, 28, 1), name="image")
    x = layers.Rescaling(1 / 255.0)(x_in)
    x = layers.Conv2D(4, 3, activation="relu")(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Flatten()(x)
    out = layers.Dense(10, activation="softmax", name="probabilities")(x)
    return tf.keras.Model(x_in, out)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    data_dir = str(root / "data")
    arrays = _image_data()
    test = _image_data(128, seed=1)
    records.write_dataset({"train": arrays, "test": test}, data_dir,
                          num_shards={"train": 2, "test": 1}, progress=False)
    tf.keras.utils.set_random_seed(1)
    model = _build()
    model.compile(optimizers.legacy_optimizer("adam", 3e-3),
                  "sparse_categorical_crossentropy", ["accuracy"])
    model_dir = str(root / "model")
    est = est_lib.to_estimator(model, model_dir, save_checkpoints_steps=60)
    train_fn = inputs.make_input_fn(data_dir, 32, training=True)
    eval_fn = inputs.make_input_fn(data_dir, 32, training=False)
    seen = []

    class Spy(tf.estimator.Exporter):
        name = "spy"

        def export(self, estimator, export_path, checkpoint_path, eval_result,
                   is_the_final_export):
            seen.append((float(eval_result["accuracy"]), checkpoint_path))

    best = est_lib.BestExporter(_build, "accuracy", schema=train_fn.files.schema,
                                   features={"image": "image"})
    metrics = est_lib.train_and_evaluate(est, train_fn, eval_fn, max_steps=120,
                                         log_every_steps=1000, exporters=[best, Spy()])
    export_dir = export_lib.export_model(_build, model_dir, schema=train_fn.files.schema,
                                         features={"image": "image"})
    preds = np.stack([p["probabilities"] for p in est.predict(eval_fn)])
    # The writer shuffles before sharding: compare in record order.
    in_order = inputs.make_dataset(data_dir, 64, training=False, split="test")
    test = {"image": np.concatenate([f["image"].numpy() for f, _ in in_order]).astype(np.uint8)}
    return {"root": root, "data_dir": data_dir, "model_dir": model_dir,
            "export_dir": export_dir, "metrics": metrics, "preds": preds,
            "test": test, "estimator": est, "evaluations": seen}


def test_training_beats_chance(trained):
    assert trained["metrics"]["accuracy"] > 0.5
    assert trained["metrics"]["global_step"] == 120


def test_h5_model_reproduces_estimator_predictions_in_fresh_process(trained):
    images = trained["test"]["image"]
    np.save(trained["root"] / "x.npy", images)
    out = fresh_python(textwrap.dedent(f"""
        import numpy as np, tensorflow as tf
        m = tf.keras.models.load_model({os.path.join(trained['export_dir'], 'model.h5')!r},
                                       compile=False)
        p = m.predict(np.load({str(trained['root'] / 'x.npy')!r}).astype('float32'), verbose=0)
        np.save({str(trained['root'] / 'p.npy')!r}, p)
        print("ok")
    """), cwd=str(trained["root"]))
    assert "ok" in out
    fresh = np.load(trained["root"] / "p.npy")
    np.testing.assert_array_equal(fresh, trained["preds"])


def test_weights_h5_loads_into_independently_built_model(trained):
    model = _build()
    model.load_weights(os.path.join(trained["export_dir"], "weights.h5"))
    preds = model.predict(trained["test"]["image"].astype("float32"), verbose=0)
    np.testing.assert_array_equal(preds, trained["preds"])


def test_exported_weights_equal_latest_checkpoint(trained):
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(trained["model_dir"]))
    model = tf.keras.models.load_model(os.path.join(trained["export_dir"], "model.h5"),
                                       compile=False)
    compared = 0
    for i, layer in enumerate(l for l in model.layers if l.weights):
        for weight, name in zip(layer.weights, ("kernel", "bias")):
            key = f"layer_with_weights-{i}/{name}/.ATTRIBUTES/VARIABLE_VALUE"
            np.testing.assert_array_equal(weight.numpy(), reader.get_tensor(key))
            compared += 1
    assert compared == 4
    info = json.load(open(os.path.join(trained["export_dir"], "export.json")))
    assert info["global_step"] == 120


def test_saved_model_signatures_agree(trained):
    loaded = tf.saved_model.load(os.path.join(trained["export_dir"], "saved_model"))
    assert set(loaded.signatures) == {"serving_default", "serve_examples"}
    images = trained["test"]["image"]
    raw = loaded.signatures["serving_default"](image=tf.constant(images, tf.float32))
    schema = manifest.load_manifest(trained["data_dir"]).schema
    serialized = [encode_example(schema, {"image": img, "label": 0}) for img in images]
    parsed = loaded.signatures["serve_examples"](examples=tf.constant(serialized))
    np.testing.assert_allclose(raw["probabilities"].numpy(), trained["preds"], atol=1e-6)
    np.testing.assert_allclose(parsed["probabilities"].numpy(), trained["preds"], atol=1e-6)


def test_export_is_atomic_and_replaces_previous(trained, tmp_path):
    target = str(tmp_path / "export")
    export_lib.export_model(_build, trained["model_dir"], export_dir=target)
    first = open(os.path.join(target, "weights.h5"), "rb").read()

    class Boom(Exception):
        pass

    def broken_builder():
        model = _build()
        original = model.save_weights

        def fail(*args, **kwargs):
            original(*args, **kwargs)
            raise Boom()
        model.save_weights = fail
        return model

    with pytest.raises(Boom):
        export_lib.export_model(broken_builder, trained["model_dir"], export_dir=target)
    assert open(os.path.join(target, "weights.h5"), "rb").read() == first
    leftovers = [n for n in os.listdir(tmp_path) if n != "export"]
    assert leftovers == [], leftovers


def test_a_failed_remote_export_leaves_no_copy_behind(trained, monkeypatch):
    """ram:// stands in for gs://: the copy beside the target goes when the
    upload fails."""
    parent = f"ram://failed-export-{os.getpid()}"
    copy_tree = io.copy_tree

    def copy_then_fail(src, dst):
        copy_tree(src, dst)
        raise OSError("connection reset")

    monkeypatch.setattr(io, "copy_tree", copy_then_fail)
    with pytest.raises(OSError, match="connection reset"):
        export_lib.export_model(_build, trained["model_dir"], export_dir=io.join(parent, "export"))
    assert io.listdir(parent) == []


def test_export_leaves_the_process_umask_alone(trained, tmp_path, monkeypatch):
    """TensorFlow's threads may write files while an export runs: the export
    neither sets nor reads the process umask, and its folder still gets the
    permissions the umask allows."""
    with open("/proc/self/status", encoding="utf-8") as f:
        umask = int(re.search(r"^Umask:\s*(\d+)", f.read(), re.M).group(1), 8)

    def no_umask(*args):
        raise AssertionError("the export called os.umask")

    monkeypatch.setattr(os, "umask", no_umask)
    target = tmp_path / "export"
    export_lib.export_model(_build, trained["model_dir"], export_dir=target)
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o777 & ~umask


def test_best_exporter_keeps_the_best_evaluation(trained):
    evaluations = trained["evaluations"]
    assert len(evaluations) >= 2
    best_accuracy, best_checkpoint = max(evaluations)
    info = json.load(open(os.path.join(trained["model_dir"], "best", "export.json")))
    assert info["metrics"]["accuracy"] == pytest.approx(best_accuracy)
    assert info["checkpoint"] == best_checkpoint
    model = tf.keras.models.load_model(
        os.path.join(trained["model_dir"], "best", "model.h5"), compile=False)
    reader = tf.train.load_checkpoint(best_checkpoint)
    np.testing.assert_array_equal(
        model.layers[2].get_weights()[0],
        reader.get_tensor("layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE"))


def test_early_stopping_ends_training_before_max_steps(trained, tmp_path):
    tf.keras.utils.set_random_seed(2)
    model = _build()
    model.compile(optimizers.legacy_optimizer("adam", 3e-3), "sparse_categorical_crossentropy",
                  ["accuracy"])
    est = est_lib.to_estimator(model, str(tmp_path), save_checkpoints_steps=20)
    # The loss falls, so "no increase in loss for 20 steps" must stop it soon.
    stop = base.EarlyStopping("loss", patience_steps=20, higher_is_better=True)
    metrics = est_lib.train_and_evaluate(
        est, inputs.make_input_fn(trained["data_dir"], 32, training=True),
        inputs.make_input_fn(trained["data_dir"], 32, training=False),
        max_steps=2000, eval_every_steps=20, early_stopping=stop, log_every_steps=1000)
    assert 20 <= metrics["global_step"] <= 200


def test_checkpoint_of_other_architecture_is_refused(trained):
    def other():
        x_in = tf.keras.Input((28, 28, 1), name="image")
        x = tf.keras.layers.Flatten()(x_in)
        return tf.keras.Model(x_in, tf.keras.layers.Dense(10)(x))

    with pytest.raises(ModelDirError, match="does not fit this model"):
        checkpoints.load_checkpoint_into(other(), tf.train.latest_checkpoint(trained["model_dir"]))


def test_new_optimizer_is_replaced_by_legacy_explicitly(tmp_path, caplog):
    model = _build()
    model.compile(tf.keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
    with caplog.at_level("INFO"):
        est = est_lib.to_estimator(model, str(tmp_path))
    assert isinstance(model.optimizer, tf.keras.optimizers.legacy.Adam)
    assert abs(float(model.optimizer.learning_rate) - 0.01) < 1e-9
    assert "legacy Adam" in caplog.text
    assert est.model_dir == str(tmp_path)


def test_feature_keys_must_match_model_inputs():
    # One input takes the one feature by arity (tests/test_one_input_models.py);
    # one input and two features is refused.
    assert model_inputs.check_feature_keys(_build(), ["pixels"]) == {"image": "pixels"}
    with pytest.raises(SchemaError, match=r"one input \('image'\).*\['id', 'pixels'\]"):
        model_inputs.check_feature_keys(_build(), ["pixels", "id"])


def test_two_input_model_trains_from_mapped_features(tmp_path):
    rng = np.random.default_rng(3)
    n = 400
    a = rng.normal(size=(n, 4)).astype(np.float32)
    b = rng.normal(size=(n, 3)).astype(np.float32)
    label = ((a[:, 0] + b[:, 1]) > 0).astype(np.int64)
    records.write_dataset({"train": {"left": a, "right": b, "label": label},
                           "test": {"left": a[:100], "right": b[:100], "label": label[:100]}},
                          str(tmp_path / "data"), num_shards={"train": 2, "test": 1},
                          progress=False)
    in_a = tf.keras.Input((4,), name="input_a")
    in_b = tf.keras.Input((3,), name="input_b")
    x = tf.keras.layers.Concatenate()([in_a, in_b])
    out = tf.keras.layers.Dense(2, activation="softmax")(x)
    model = tf.keras.Model([in_a, in_b], out)
    model.compile(optimizers.legacy_optimizer("adam", 0.05), "sparse_categorical_crossentropy",
                  ["accuracy"])
    mapping = {"input_a": "left", "input_b": "right"}
    est = est_lib.to_estimator(model, str(tmp_path / "model"), save_checkpoints_steps=100)
    train_fn = inputs.make_input_fn(str(tmp_path / "data"), 32, training=True,
                                    features=mapping)
    eval_fn = inputs.make_input_fn(str(tmp_path / "data"), 32, training=False,
                                   features=mapping)
    metrics = est_lib.train_and_evaluate(est, train_fn, eval_fn, max_steps=100,
                                         log_every_steps=1000)
    assert metrics["accuracy"] > 0.85


class _Exports:
    """Records what BestCandidate.export asks of an engine's export_if_best,
    and reads the candidate's file while it is there."""

    def __init__(self):
        self.calls = []

    def __call__(self, model_builder, model_dir, checkpoint, metrics, metric,
                 higher_is_better, **options):
        with open(checkpoint, "rb") as f:
            self.calls.append((checkpoint, f.read(), dict(metrics), metric, higher_is_better,
                               options))
        return os.path.join(model_dir, export_lib.BEST_DIR)


def _checkpoint(model_dir, step, content):
    path = os.path.join(model_dir, f"ckpt-{step}.weights.h5")
    with open(path, "wb") as f:
        f.write(content)
    return path


@pytest.mark.parametrize("higher", [True, False])
def test_best_candidate_keeps_the_best_evaluation_until_the_end(tmp_path, higher):
    model_dir = str(tmp_path)
    # A metric that improves downward (a loss) sets aside the lowest, upward the highest.
    values = [0.5, 0.7, 0.6] if higher else [0.5, 0.3, 0.4]
    best = export_lib.BestCandidate(model_dir, "m", higher_is_better=higher)
    kept = [best.consider(_checkpoint(model_dir, step, b"w%d" % step), {"m": value, "x": 1})
            for step, value in zip((10, 20, 30), values)]
    assert kept == [True, True, False]
    candidate = tmp_path / export_lib.CANDIDATE_DIR
    # One file set aside: the second evaluation's, the first's dropped.
    assert sorted(os.listdir(candidate)) == ["candidate.json", "ckpt-20.weights.h5"]
    # A run that dies here leaves it to the next run, which still compares with it.
    again = export_lib.BestCandidate(model_dir, "m", higher_is_better=higher)
    assert not again.consider(_checkpoint(model_dir, 40, b"w40"), {"m": values[2], "x": 1})
    exports = _Exports()
    assert again.export("builder", exports, schema="s") == str(tmp_path / "best")
    [(path, content, metrics, metric, up, options)] = exports.calls
    assert (content, metrics, metric, up, options) == (b"w20", {"m": values[1], "x": 1.0},
                                                       "m", higher, {"schema": "s"})
    assert os.path.basename(path) == "ckpt-20.weights.h5"
    assert not candidate.exists()
    assert again.export("builder", exports) is None and len(exports.calls) == 1


def test_best_candidate_must_beat_the_best_export_already_written(tmp_path):
    best_dir = tmp_path / export_lib.BEST_DIR
    best_dir.mkdir()
    (best_dir / export_lib.EXPORT_INFO).write_text(json.dumps({"metrics": {"m": 0.8}}))
    best = export_lib.BestCandidate(str(tmp_path), "m")
    assert not best.consider(_checkpoint(str(tmp_path), 10, b"w"), {"m": 0.7})
    assert not (tmp_path / export_lib.CANDIDATE_DIR).exists()
    assert best.consider(_checkpoint(str(tmp_path), 20, b"w"), {"m": 0.9})
    with pytest.raises(ModelDirError, match="'m' is not among the eval metrics"):
        best.consider(_checkpoint(str(tmp_path), 30, b"w"), {"loss": 0.1})


@pytest.mark.parametrize("info", [
    "{not json",
    json.dumps({"file": "ckpt-20.weights.h5", "metrics": {"other": 1.0}}),
    json.dumps({"file": "../../outside.weights.h5", "metrics": {"m": 1.0}}),
])
def test_a_damaged_best_candidate_is_named_and_nothing_outside_is_read(tmp_path, info):
    candidate = tmp_path / export_lib.CANDIDATE_DIR
    candidate.mkdir()
    (candidate / export_lib.CANDIDATE_INFO).write_text(info)
    with pytest.raises(ModelDirError, match=re.escape(str(candidate / "candidate.json"))):
        export_lib.BestCandidate(str(tmp_path), "m")
