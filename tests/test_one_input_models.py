"""A model of one input gets the pipeline's one feature, whatever its input
is called: functional or Sequential, named or not, on every engine. Keras
names an unnamed Input itself from a per-process counter (``keras_tensor_3``,
``input_2``), so the model checked against the records and the one an engine
builds later may differ in name: one input and one feature bind by arity.
Several inputs are still matched by name, and their refusal names what an
experiment's author can change."""

import json
import os
import re
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from estimator_keras import engines, model_inputs, records
from estimator_keras.errors import SchemaError
from experiments import DataConfig, ExperimentConfig
from experiments.training import context
from docs_pages import readme_block
from support import KERAS3_BACKENDS, cli, child_env, export_model_file, fresh_python

layers = tf.keras.layers


def _sequential():
    # As Keras' own examples write one: the Input unnamed.
    return tf.keras.Sequential([tf.keras.Input(shape=(4, 4, 1)), layers.Flatten(),
                                layers.Dense(2, activation="softmax")])


def _functional(name=None):
    x = tf.keras.Input(shape=(4, 4, 1), name=name)
    return tf.keras.Model(x, layers.Dense(2, activation="softmax")(layers.Flatten()(x)))


def _two_inputs():
    a, b = tf.keras.Input((3,), name="left"), tf.keras.Input((2,), name="right")
    return tf.keras.Model([a, b], layers.Dense(2)(layers.Concatenate()([a, b])))


def _batches(features):
    images = np.arange(2 * 16, dtype=np.float32).reshape(2, 4, 4, 1)
    return tf.data.Dataset.from_tensor_slices(
        ({name: images for name in features}, np.array([0, 1]))).batch(2)


# ------------------------------------------------------------------ binding

def test_one_input_binds_to_the_one_feature_whatever_the_names():
    assert model_inputs.bind_inputs(["keras_tensor_3"], ["image"]) == {"keras_tensor_3": "image"}
    for model in (_sequential(), _functional(), _functional("pixels")):
        (name,) = model_inputs.input_names(model)
        assert model_inputs.check_feature_keys(model, ["image"]) == {name: "image"}


def test_several_inputs_match_by_name_and_say_what_to_change():
    model = _two_inputs()
    assert model_inputs.check_feature_keys(model, ["right", "left"]) == {"left": "left",
                                                                   "right": "right"}
    with pytest.raises(SchemaError) as refused:
        model_inputs.check_feature_keys(model, ["left", "image"], hint=context.FEATURES_HINT)
    message = str(refused.value)
    assert "missing ['right']" in message and "unexpected ['image']" in message, message
    assert "keras.Input(..., name=...)" in message and "data.features" in message, message
    assert "InputConfig" not in message, message
    with pytest.raises(SchemaError, match=r"one input .* 2 features"):
        model_inputs.check_feature_keys(_sequential(), ["image", "depth"])


def test_a_model_without_inputs_is_refused_with_what_to_do():
    lazy = tf.keras.Sequential([layers.Dense(2)])
    with pytest.raises(SchemaError, match=r"begin it with keras.Input"):
        model_inputs.check_feature_keys(lazy, ["image"])


def test_check_inputs_of_an_experiment_refuses_mismatched_inputs_without_inputconfig(tmp_path):
    records.write_dataset({"train": {"left": np.zeros((8, 3), np.float32),
                                     "right": np.zeros((8, 2), np.float32),
                                     "label": np.zeros(8, np.int64)}},
                          str(tmp_path / "data"), progress=False)
    config = ExperimentConfig(name="two", description="",
                              data=DataConfig(dataset=str(tmp_path / "data"),
                                              features={"left": "left", "other": "right"}))
    with pytest.raises(SchemaError) as refused:
        context.check_inputs(_two_inputs(), config, str(tmp_path / "data"))
    message = str(refused.value)
    assert "data.features" in message and "InputConfig" not in message, message
    config.data.features = {"left": "left", "right": "right"}
    schema, mapping = context.check_inputs(_two_inputs(), config, str(tmp_path / "data"))
    assert mapping == {"left": "left", "right": "right"} and "label" in schema


def test_check_inputs_of_an_unnamed_input_compares_shapes(tmp_path):
    records.write_dataset({"train": {"image": np.zeros((8, 5, 5, 1), np.uint8),
                                     "label": np.zeros(8, np.int64)}},
                          str(tmp_path / "data"), progress=False)
    config = ExperimentConfig(name="one", description="",
                              data=DataConfig(dataset=str(tmp_path / "data")))
    with pytest.raises(SchemaError, match=r"does not fit the model's input: the model expects "
                                          r"shape \[4, 4, 1\].*shape \[5, 5, 1\]"):
        context.check_inputs(_sequential(), config, str(tmp_path / "data"))


# ------------------------------------------------------------------ feeding

@pytest.mark.parametrize("build", [_sequential, _functional, lambda: _functional("pixels")],
                         ids=["sequential", "functional_unnamed", "functional_named"])
def test_a_model_of_one_input_is_fed_its_tensor(build):
    model = build()
    fed = model_inputs.as_model_inputs(model, _batches(["image"]))
    features, labels = next(iter(fed))
    assert isinstance(features, tf.Tensor) and features.shape == (2, 4, 4, 1)
    # What the model computes on it is what it computes on the images.
    expected = model(np.arange(32, dtype=np.float32).reshape(2, 4, 4, 1))
    np.testing.assert_allclose(model(features), expected, rtol=1e-6)
    assert list(labels.numpy()) == [0, 1]
    # A dataset of features alone (prediction) too.
    alone = model_inputs.as_model_inputs(model, _batches(["image"]).map(lambda f, _: f))
    assert isinstance(alone.element_spec, tf.TensorSpec)


def test_a_model_built_on_a_dict_of_one_input_gets_a_dict_under_its_key():
    x = tf.keras.Input((4, 4, 1), name="x")
    model = tf.keras.Model({"x": x}, layers.Flatten()(x))
    features, _ = next(iter(model_inputs.as_model_inputs(model, _batches(["image"]))))
    assert list(features) == ["x"] and features["x"].shape == (2, 4, 4, 1)


def test_several_inputs_get_the_dict_unchanged():
    data = tf.data.Dataset.from_tensors(({"left": tf.zeros((1, 3)), "right": tf.zeros((1, 2))},
                                         tf.zeros((1,))))
    assert model_inputs.as_model_inputs(_two_inputs(), data) is data


# ------------------------------------------------------------------ serving


def _serving_functions(model, **options):
    """The export's signatures of ``model``, by the exporter of its Keras."""
    # pylint: disable=import-outside-toplevel
    if hasattr(model, "input_names"):  # Keras 2; Keras 3 has no input names
        from estimator_keras import export
    else:
        from estimator_keras.engines.keras3 import export
    return export.serving_functions(model, **options)


def test_the_signatures_take_the_feature_name_and_return_fixed_keys():
    images = np.arange(2 * 16, dtype=np.float32).reshape(2, 4, 4, 1) / 32
    unnamed = tf.keras.Input((4, 4, 1))
    logits = tf.keras.Model(unnamed, layers.Dense(2)(layers.Flatten()(unnamed)))
    raw = _serving_functions(logits, features={"pixels": "image"}, class_names=["a", "b"],
                             output_activation="softmax")["serving_default"]
    (taken,), _ = raw.get_concrete_function().structured_input_signature
    assert list(taken) == ["pixels"] and taken["pixels"].name == "pixels", taken
    out = raw({"pixels": tf.constant(images)})
    assert sorted(out) == ["class_id", "class_name", "probabilities"]
    # A logits model serves the softmax of its output.
    np.testing.assert_allclose(out["probabilities"].numpy(),
                               tf.nn.softmax(logits(images)).numpy(), atol=1e-6)
    np.testing.assert_array_equal(out["class_id"].numpy(), out["probabilities"].numpy().argmax(1))
    flat = layers.Flatten()
    x = tf.keras.Input((4, 4, 1))
    two = tf.keras.Model(x, [layers.Dense(2)(flat(x)), layers.Dense(3)(flat(x))])
    out = _serving_functions(two, features={"image": "image"})["serving_default"](
        {"image": tf.constant(images)})
    assert {k: tuple(v.shape) for k, v in out.items()} == {"output_0": (2, 2),
                                                         "output_1": (2, 3)}


# ------------------------------------------------------------------ on every engine

PLUGIN = textwrap.dedent('''
    """A user's module: a Sequential model with an unnamed Input, as Keras 3's examples write it."""
    import numpy as np

    from experiments import (DataConfig, Experiment, ExperimentConfig, TrainConfig, register,
                             register_dataset)


    def blobs(source_dir=None, download_dir=None):
        rng = np.random.default_rng(0)

        def split(n):
            labels = rng.integers(0, 2, n)
            images = rng.integers(0, 60, (n, 8, 8, 1)).astype(np.uint8)
            images[labels == 0, :4] += 150
            images[labels == 1, 4:] += 150
            return {"image": images, "label": labels}

        return {"train": split(320), "test": split(96)}


    register_dataset("seq_blobs", "8x8 blobs", blobs,
                     labels={"label": {"num_classes": 2, "class_names": ["top", "bottom"]}})


    def sequential_cnn(hparams, data):
        import tensorflow as tf

        layers = tf.keras.layers
        return tf.keras.Sequential([
            tf.keras.Input(shape=data.input_shape), layers.Rescaling(1 / 255),
            layers.Conv2D(4, 3, activation="relu"), layers.Flatten(),
            layers.Dense(data.num_classes, activation="softmax")])


    register(Experiment(
        config=ExperimentConfig(
            name="seq_blobs_cnn", description="a Sequential CNN",
            data=DataConfig(dataset="seq_blobs"),
            train=TrainConfig(batch_size=32, max_steps=20, eval_every_steps=10, log_every_steps=10,
                              learning_rate=3e-3),
            model={}),
        build_model=sequential_cnn))
''')


def _available(engine):
    return dict((name, ok) for name, ok, _ in engines.statuses())[engine]


ENGINE_CASES = [
    pytest.param("estimator", None, marks=pytest.mark.skipif(
        not _available("estimator"), reason="tf.estimator ends with TensorFlow 2.15")),
    pytest.param("keras", None, marks=pytest.mark.skipif(
        not _available("keras"), reason="the keras engine needs Keras 2 (tf-keras)")),
    # The keras3 engine's backends, as every keras3 case has them (tests/support.py).
    *(pytest.param("keras3", case.values[0], marks=case.marks) for case in KERAS3_BACKENDS),
]


def _test_split(data_dir):
    """(serialized records, labels) of the test split."""
    files = records.resolve(str(data_dir / "seq_blobs"), "test").files
    serialized = np.array(list(tf.data.TFRecordDataset(files).as_numpy_iterator()), dtype=object)
    labels = tf.io.parse_example(serialized, {"label": tf.io.FixedLenFeature([], tf.int64)})
    return serialized, labels["label"].numpy()


@pytest.mark.slow
@pytest.mark.parametrize("engine,backend", ENGINE_CASES,
                         ids=["estimator", "keras", "keras3-tensorflow", "keras3-jax"])
def test_a_plugin_sequential_model_trains_evaluates_and_exports(tmp_path, engine, backend):
    module = tmp_path / "my_experiments.py"
    module.write_text(PLUGIN)
    env = child_env(**({"KERAS_BACKEND": backend} if backend else {}))
    rc, out, err = cli("--module", module, "train", "seq_blobs_cnn", "--engine", engine,
                     "--model-dir", tmp_path / "run", "--data-dir", tmp_path / "data",
                     timeout=600, env=env)
    assert rc == 0, err[-3000:]
    header = err.splitlines()[0]
    assert re.search(rf"; engine {engine} \({backend or 'tensorflow'}, \w", header), header
    # Keras 3's JAX backend on the CPU is several times slower for convolutions: said once.
    slow = [line for line in err.splitlines() if "runs convolutions on the CPU" in line]
    assert len(slow) == (1 if f"({backend}, cpu)" in header and backend == "jax" else 0), err
    final = re.search(r"final metrics: accuracy ([\d.]+)", out)
    assert final and "checkpoint step 20" in out, out + err[-3000:]
    assert os.path.exists(export_model_file(tmp_path / "run" / "export"))
    # evaluate rebuilds the model (a new unnamed Input) and reads the checkpoint.
    rc, out, err = cli("--module", module, "evaluate", "seq_blobs_cnn", "--engine", engine,
                       "--model-dir", tmp_path / "run", "--data-dir", tmp_path / "data",
                       "--json", timeout=300, env=env)
    assert rc == 0, err[-3000:]
    assert abs(json.loads(out)["accuracy"] - float(final.group(1))) < 1e-3, out
    # The export's serve_examples binds the records' one feature to the one input.
    serialized, labels = _test_split(tmp_path / "data")
    signature = tf.saved_model.load(str(tmp_path / "run" / "export" / "saved_model")
                                    ).signatures["serve_examples"]
    outputs = signature(examples=tf.constant(serialized))
    assert sorted(outputs) == ["class_id", "class_name", "probabilities"], sorted(outputs)
    probabilities = outputs["probabilities"].numpy()
    assert probabilities.shape == (len(labels), 2)
    np.testing.assert_array_equal(outputs["class_id"].numpy(), probabilities.argmax(axis=-1))
    accuracy = float(np.mean(probabilities.argmax(axis=-1) == labels))
    assert abs(accuracy - float(final.group(1))) < 0.03, (accuracy, final.group(1))
    # Exported again by `export`, in a process that numbers Keras' automatic
    # names afresh: the signatures take the feature's name and return fixed
    # keys in every export of the model.
    rc, _, err = cli("--module", module, "export", "seq_blobs_cnn", "--model-dir",
                     tmp_path / "run", "--export-dir", tmp_path / "run" / "again",
                     "--data-dir", tmp_path / "data", timeout=300, env=env)
    assert rc == 0, err[-3000:]
    exports = [tmp_path / "run" / name for name in ("export", "best", "again")]
    for export in exports:
        raw = tf.saved_model.load(str(export / "saved_model")).signatures["serving_default"]
        assert list(raw.structured_input_signature[1]) == ["image"], (export, raw)
        assert sorted(raw.structured_outputs) == ["class_id", "class_name", "probabilities"]
        info = json.loads((export / "export.json").read_text())
        assert list(info["inputs"]) == ["image"], info
        assert info["outputs"] == ["probabilities", "class_id", "class_name"], info
    if engine != "keras3" or backend == "tensorflow":  # Keras 2's tf.keras reads Keras 2's h5
        _run_the_tutorials_predict_py(tmp_path, exports[:2])


def _run_the_tutorials_predict_py(tmp_path, exports):
    """The tutorial's predict.py, as written, on each export, in a Python
    without this package; a photo of the class "top", grey on white, larger
    than the records' 8x8 images."""
    photo = np.full((32, 32, 3), 20, np.uint8)
    photo[:16] = 210
    (tmp_path / "my_photo.jpg").write_bytes(tf.io.encode_jpeg(photo).numpy())
    snippet = readme_block("predict.py") + readme_block("predict.py, continued")
    script = "".join(snippet.replace('"runs/image_classifier/export"', repr(str(export)))
                     for export in exports)
    lines = fresh_python(script, tmp_path).splitlines()
    assert len(lines) == 2 * len(exports), lines
    for h5_line, served in zip(lines[::2], lines[1::2]):
        # model.h5's class, then the SavedModel's, from the same model.
        name = h5_line.split()[0]
        assert name in ("top", "bottom") and served == f"[b'{name}']", lines
