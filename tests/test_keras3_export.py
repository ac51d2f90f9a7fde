"""Keras 3 exports: weights.h5 moves between all four (engine, Keras)
pairs, and a fresh Keras 3 process without this package loads model.keras
and the SavedModel of a model trained on either backend.

Every pair lives in its own interpreter (tests/keras_envs.py): writers save
in one child process, readers load in another.
"""

import json
import textwrap

import numpy as np
import pytest

from keras_envs import PAIRS, interpreter, once_per_pair, run
from support import NO_PACKAGE

pytestmark = pytest.mark.slow

# Builders of experiments/catalog/models.py: a plain stack, batch normalization
# (non-trainable weights), and a U-Net (branches, Conv2DTranspose).
_COMMON = textwrap.dedent("""
    import json, os, sys, types
    import numpy as np
    import tensorflow as tf
    from experiments.catalog import models

    VECTORS = types.SimpleNamespace(input_shape=(5,), input_name="x", num_classes=3)
    BUILDERS = {
        "seed_cnn": lambda: models.seed_cnn({"filters": 2, "dense_units": 8}),
        "vector_classifier": lambda: models.image_classifier({"filters": 2}, VECTORS),
        "unet": lambda: models.unet({"filters": 2, "depth": 2}),
    }

    def inputs(name, model):
        rng = np.random.default_rng(123)
        shape = (4, *model.inputs[0].shape[1:])
        if name == "vector_classifier":
            return rng.normal(0, 2, shape).astype("float32")
        return rng.uniform(0, 255, shape).astype("float32")
""")

_WRITE = _COMMON + textwrap.dedent("""
    pair, out = sys.argv[1], sys.argv[2]
    keras3 = pair.startswith("keras3")
    preds = {}
    for number, (name, build) in enumerate(sorted(BUILDERS.items())):
        model = build()
        # Values unlike any initializer's, different per writer: a load that
        # silently kept the reader's own weights cannot pass.
        rng = np.random.default_rng(1000 * len(pair) + number)
        values = []
        for w in model.weights:
            value = rng.normal(0, 0.3, tuple(w.shape)).astype("float32")
            values.append(np.abs(value) + 0.5 if "moving_variance" in w.name else value)
        model.set_weights(values)
        path = os.path.join(out, name + ".h5")
        if keras3:
            from estimator_keras.engines.keras3 import export as keras3_export
            keras3_export.save_legacy_weights(model, path)
        else:
            model.save_weights(path)  # what estimator_keras.export writes
        preds[name] = model.predict(inputs(name, model), verbose=0).tolist()
    with open(os.path.join(out, "preds.json"), "w") as f:
        json.dump(preds, f)
""")

_READ = _COMMON + textwrap.dedent("""
    writers = json.loads(sys.argv[1])
    result = {}
    for writer, folder in writers.items():
        expected = json.load(open(os.path.join(folder, "preds.json")))
        for name, build in BUILDERS.items():
            model = build()
            model.load_weights(os.path.join(folder, name + ".h5"))
            got = model.predict(inputs(name, model), verbose=0)
            result.setdefault(writer, {})[name] = float(
                np.abs(got - np.array(expected[name])).max())
    print(json.dumps(result))
""")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """pair -> folder of its weights files, for each pair this machine has."""
    folders = {}
    for pair in PAIRS:
        try:
            interpreter(pair)
        except pytest.skip.Exception:
            continue
        folder = tmp_path_factory.mktemp(pair)
        run(pair, _WRITE, pair, folder)
        folders[pair] = str(folder)
    return folders


@pytest.fixture(scope="module")
def read(written):
    """reader pair -> writer pair -> builder -> largest prediction difference."""
    return once_per_pair(
        lambda reader: json.loads(run(reader, _READ, json.dumps(written)).splitlines()[-1]))


@pytest.mark.parametrize("reader", PAIRS)
@pytest.mark.parametrize("writer", PAIRS)
def test_weights_move_between_engines_and_keras_versions(written, read, writer, reader):
    if writer not in written:
        interpreter(writer)  # skips, saying why
    differences = read(reader)[writer]
    assert sorted(differences) == ["seed_cnn", "unet", "vector_classifier"]
    for name, difference in differences.items():
        assert difference < 1e-5, (writer, reader, name, difference)


_TRAIN_AND_EXPORT = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import keras
    import tensorflow as tf
    from estimator_keras.engines.keras3 import export as keras3_export
    from estimator_keras.schema import FeatureSpec
    from experiments.catalog import models

    out = sys.argv[1]
    keras.utils.set_random_seed(3)
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 10, 256)
    images = rng.integers(0, 60, (256, 28, 28, 1)).astype("uint8")
    for i, k in enumerate(labels):
        images[i, 2 * k + 4:2 * k + 7] += 180
    model = models.seed_cnn({"filters": 4, "dense_units": 16})
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    data = tf.data.Dataset.from_tensor_slices((images.astype("float32"), labels)).batch(32)
    history = model.fit(data, epochs=3, verbose=0)
    schema = {"image": FeatureSpec("image", "uint8", (28, 28, 1), "raw"),
              "label": FeatureSpec("label", "int64", (), "int64")}
    names = [f"class-{i}" for i in range(10)]
    keras3_export.write_export(model, os.path.join(out, "export"), step=24, schema=schema,
                               features={"image": "image"}, class_names=names,
                               metadata={"metrics": {"accuracy": 0.5}})
    test = images[:16]
    np.save(os.path.join(out, "test.npy"), test)
    np.save(os.path.join(out, "preds.npy"), model.predict(test.astype("float32"), verbose=0))
    print(json.dumps({"accuracy": history.history["accuracy"][-1]}))
""")

# Runs with no access to this package: what a plain Keras 3 user has.
_PLAIN_KERAS3 = NO_PACKAGE + textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import keras
    import tensorflow as tf

    out = sys.argv[1]
    test = np.load(os.path.join(out, "test.npy"))
    model = keras.saving.load_model(os.path.join(out, "export", "model.keras"))
    result = {"model_keras": model.predict(test.astype("float32"), verbose=0).tolist()}
    # The line the other engines' exports document loads this one too.
    h5 = tf.keras.models.load_model(os.path.join(out, "export", "model.h5"), compile=False)
    result["model_h5"] = h5.predict(test.astype("float32"), verbose=0).tolist()
    served = tf.saved_model.load(os.path.join(out, "export", "saved_model"))
    result["signatures"] = sorted(served.signatures)
    raw = served.signatures["serving_default"](image=tf.constant(test, tf.float32))
    result["raw_keys"] = sorted(raw)
    result["raw"] = raw["probabilities"].numpy().tolist()
    result["class_name"] = [n.decode() for n in raw["class_name"].numpy()]
    examples = [tf.train.Example(features=tf.train.Features(feature={"image": tf.train.Feature(
        bytes_list=tf.train.BytesList(value=[image.tobytes()]))})).SerializeToString()
        for image in test]
    served_examples = served.signatures["serve_examples"](examples=tf.constant(examples))
    result["examples"] = served_examples["probabilities"].numpy().tolist()
    print(json.dumps(result))
""")


@pytest.mark.parametrize("pair", ["keras3-tensorflow", "keras3-jax"])
def test_a_plain_keras3_process_loads_the_export_of_a_trained_model(pair, tmp_path):
    trained = json.loads(run(pair, _TRAIN_AND_EXPORT, tmp_path).splitlines()[-1])
    assert trained["accuracy"] > 0.3  # chance is 0.1: the model learned
    export = tmp_path / "export"
    assert sorted(p.name for p in export.iterdir()) == [
        "export.json", "model.h5", "model.keras", "saved_model", "weights.h5"]
    info = json.loads((export / "export.json").read_text())
    assert info["global_step"] == 24 and info["backend"] == pair.split("-")[1]
    assert info["inputs"] == {"image": {"shape": [28, 28, 1], "dtype": "float32"}}
    assert info["outputs"] == ["probabilities", "class_id", "class_name"]
    assert info["metrics"] == {"accuracy": 0.5}

    loaded = json.loads(run(pair, _PLAIN_KERAS3,
                            tmp_path).splitlines()[-1])
    preds = np.load(tmp_path / "preds.npy")
    assert preds.std() > 0.01  # a trained softmax, not a constant
    assert np.abs(np.array(loaded["model_keras"]) - preds).max() < 1e-5
    assert np.abs(np.array(loaded["model_h5"]) - preds).max() < 1e-5
    assert loaded["signatures"] == ["serve_examples", "serving_default"]
    assert loaded["raw_keys"] == ["class_id", "class_name", "probabilities"]
    assert np.abs(np.array(loaded["raw"]) - preds).max() < 1e-5
    assert np.abs(np.array(loaded["examples"]) - preds).max() < 1e-5
    assert loaded["class_name"] == [f"class-{i}" for i in preds.argmax(axis=1)]
