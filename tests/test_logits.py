"""A model that outputs logits, as keras.io's examples write it (the last
layer ``Dense(n)`` with no activation, compiled with ``from_logits=True``):
the loss takes Keras' loss class settings beside its name, the model trains
as plain Keras trains it, its exports serve probabilities, and the same
model under a loss that expects probabilities is refused before training."""

import json
import re
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from estimator_keras import losses
from estimator_keras.errors import ConfigError
from experiments import DataConfig, ExperimentConfig
from experiments.config import files as config_files
from docs_pages import readme_block
from support import child_env, cli, fresh_python, latest_step

# The data and the model, shared by the user's module and plain Keras below.
COMMON = textwrap.dedent('''
    import numpy as np

    CLASSES = ["north_west", "north_east", "south_west", "south_east"]


    def quadrants(source_dir=None, download_dir=None):
        """12x12 grey images: a bright quadrant names the class."""
        rng = np.random.default_rng(0)

        def split(n):
            labels = rng.integers(0, 4, n)
            images = rng.integers(0, 90, (n, 12, 12, 1)).astype(np.uint8)
            for i, label in enumerate(labels):
                rows, cols = divmod(int(label), 2)
                images[i, 6 * rows:6 * rows + 6, 6 * cols:6 * cols + 6] += 120
            return {"image": images, "label": labels}

        return {"train": split(480), "test": split(160)}


    def from_scratch(hparams, data=None):
        """keras.io's "image classification from scratch", small: logits out."""
        import keras
        from keras import layers

        inputs = keras.Input(shape=(12, 12, 1))
        x = layers.Rescaling(1.0 / 255)(inputs)
        x = layers.Conv2D(8, 3, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D(2)(x)
        x = layers.Flatten()(x)
        x = layers.Dropout(0.25)(x)
        outputs = layers.Dense(4, activation=None)(x)
        return keras.Model(inputs, outputs)
''')

PLUGIN = COMMON + textwrap.dedent('''
    from experiments import DataConfig, Experiment, ExperimentConfig, TrainConfig, register
    from experiments import register_dataset

    register_dataset("quadrants", "bright quadrants", quadrants,
                     labels={"label": {"num_classes": 4, "class_names": CLASSES}})
    TRAIN = TrainConfig(batch_size=32, max_steps=STEPS, eval_every_steps=STEPS,
                        log_every_steps=STEPS, learning_rate=3e-3, seed=7)
    register(Experiment(config=ExperimentConfig(
        name="quadrant_logits", description="logits, from_logits set",
        data=DataConfig(dataset="quadrants"), train=TRAIN,
        loss={"name": "sparse_categorical_crossentropy", "from_logits": True}),
        build_model=from_scratch))
    register(Experiment(config=ExperimentConfig(
        name="quadrant_unset", description="logits, from_logits not set",
        data=DataConfig(dataset="quadrants"), train=TRAIN), build_model=from_scratch))
''')
STEPS = 60


def _plain_keras_accuracy():
    """The same model, data, optimizer and steps in plain Keras."""
    import keras  # pylint: disable=import-outside-toplevel

    namespace = {}
    exec(COMMON, namespace)  # pylint: disable=exec-used
    splits = namespace["quadrants"]()
    keras.utils.set_random_seed(7)
    model = namespace["from_scratch"]({})
    model.compile(optimizer=keras.optimizers.Adam(3e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    train = splits["train"]
    per_epoch = len(train["label"]) // 32
    model.fit(train["image"].astype("float32"), train["label"], batch_size=32,
              epochs=STEPS // per_epoch, verbose=0)
    test = splits["test"]
    return model.evaluate(test["image"].astype("float32"), test["label"], verbose=0,
                          return_dict=True)["accuracy"]


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    root = tmp_path_factory.mktemp("logits")
    module = root / "my_experiments.py"
    module.write_text(PLUGIN.replace("STEPS", str(STEPS)))
    return root, module


@pytest.mark.slow
def test_a_logits_model_trains_as_plain_keras_does_and_serves_probabilities(plugin):
    root, module = plugin
    rc, out, err = cli("--module", module, "train", "quadrant_logits", "--engine", "keras3",
                       "--model-dir", root / "run", "--data-dir", root / "data",
                       timeout=600, env=child_env(KERAS_BACKEND="tensorflow"))
    assert rc == 0, err[-3000:]
    ours = float(re.search(r"final metrics: accuracy ([\d.]+)", out).group(1))
    plain = _plain_keras_accuracy()
    # Chance is 0.25; a probabilities loss on these logits stays there.
    assert ours >= 0.7 and ours >= plain - 0.1, (ours, plain)
    print(f"accuracy after {STEPS} steps: ours {ours:.4f}, plain Keras {plain:.4f}")
    export = root / "run" / "export"
    info = json.loads((export / "export.json").read_text())
    assert info["output_activation"] == "softmax", info
    images = namespace_images()
    serve = tf.saved_model.load(str(export / "saved_model")).signatures["serving_default"]
    served = serve(image=tf.constant(images))
    probabilities = served["probabilities"].numpy()
    np.testing.assert_allclose(probabilities.sum(axis=-1), 1.0, rtol=1e-5)
    # The model's own output, with the activation export.json names: the same.
    logits = fresh_python(
        "import json, numpy as np, tensorflow as tf\n"
        f"model = tf.keras.models.load_model({str(export / 'model.h5')!r}, compile=False)\n"
        f"print(json.dumps(model.predict(np.array({images.tolist()}, np.float32), "
        "verbose=0).tolist()))\n", root)
    expected = tf.nn.softmax(np.array(json.loads(logits))).numpy()
    np.testing.assert_allclose(probabilities, expected, atol=1e-5)
    assert served["class_id"].numpy().tolist() == [0, 1, 2, 3]
    # The tutorial's predict.py on a photo of the class south_east: its two
    # lines agree, with the probability the SavedModel gives.
    photo = np.full((48, 48, 3), 30, np.uint8)
    photo[24:, 24:] = 220
    (root / "my_photo.jpg").write_bytes(tf.io.encode_jpeg(photo).numpy())
    snippet = readme_block("predict.py") + readme_block("predict.py, continued")
    lines = fresh_python(snippet.replace('"runs/image_classifier/export"', repr(str(export))),
                         root).splitlines()
    name, percent = lines[0].split()
    assert name == "south_east" and lines[1] == "[b'south_east']", lines
    assert 25 < int(percent.rstrip("%")) <= 100, lines


def namespace_images():
    """One clear image of each class, in class-id order."""
    images = np.full((4, 12, 12, 1), 40, np.float32)
    for label in range(4):
        rows, cols = divmod(label, 2)
        images[label, 6 * rows:6 * rows + 6, 6 * cols:6 * cols + 6] = 200
    return images


@pytest.mark.slow
def test_logits_under_a_probabilities_loss_are_refused_before_training(plugin):
    root, module = plugin
    rc, out, err = cli("--module", module, "train", "quadrant_unset", "--engine", "keras3",
                       "--model-dir", root / "unset", "--data-dir", root / "data",
                       timeout=300, env=child_env(KERAS_BACKEND="tensorflow"))
    assert rc == 2, (out, err[-3000:])
    message = err.strip().splitlines()[-1]
    assert re.search(r"last layer '\w+' \(Dense\) has a linear activation", message), message
    assert "from_logits: true" in message and "sparse_categorical_crossentropy" in message
    assert "Traceback" not in err and latest_step(root / "unset") is None, err[-3000:]


# ------------------------------------------------------------------ the setting


def test_the_loss_takes_keras_loss_class_settings_and_names_a_wrong_one():
    import keras  # pylint: disable=import-outside-toplevel

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    loss = losses.keras_loss({"name": "categorical_crossentropy", "from_logits": True,
                              "label_smoothing": 0.1}, model)
    assert isinstance(loss, keras.losses.CategoricalCrossentropy)
    assert loss.get_config()["from_logits"] and loss.get_config()["label_smoothing"] == 0.1
    assert losses.keras_loss("mse", model) == "mse"  # a name passes unchanged
    with pytest.raises(ConfigError, match=r"^loss\.from_logit: SparseCategoricalCrossentropy "
                                          r".* takes no setting 'from_logit'; it takes .*"
                                          r"from_logits"):
        losses.keras_loss({"name": "sparse_categorical_crossentropy", "from_logit": True}, model)
    with pytest.raises(ConfigError, match=r"^loss\.name: 'crossentropy' names no loss class"):
        losses.check_logits(model, {"name": "crossentropy", "from_logits": True})
    assert losses.output_activation({"name": "binary_crossentropy", "from_logits": True}) == \
        "sigmoid"
    assert losses.output_activation("sparse_categorical_crossentropy") is None


def test_a_config_file_sets_the_loss_as_a_mapping():
    config = ExperimentConfig(name="mine", description="", data=DataConfig(dataset="mine"))
    changed = config_files.apply(config, {"loss": {"name": "sparse_categorical_crossentropy",
                                                   "from_logits": True}})
    assert changed.loss == {"name": "sparse_categorical_crossentropy", "from_logits": True}
    assert config_files.apply(changed, {"loss": "sparse_categorical_crossentropy"}).loss == \
        "sparse_categorical_crossentropy"
    with pytest.raises(ConfigError, match=r"loss: expected str like the default"):
        config_files.apply(config, {"loss": 3})
