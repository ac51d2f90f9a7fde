"""Model builders shared by the experiments.

Every builder takes ``(hparams, data)``: the model hyperparameters and the
:class:`~experiments.config.data_info.DataInfo` of the dataset (input shape and
dtype, number of classes), so that one builder fits any prepared dataset.
Called without data (rebuilding a model in plain Keras), the seed models take
Fashion-MNIST's 28x28x1 and 10 classes, the U-Net the shapes dataset's.

Every builder returns an uncompiled functional Keras model whose inputs take
the records' raw values (pixels 0-255) and scale them inside the model, so an
exported model predicts correctly for a user who knows nothing of the input
pipeline. Only built-in Keras layers are used: ``model.h5`` then loads with
``tf.keras.models.load_model(path, compile=False)`` and no custom objects.

Each builder takes its Keras from
:func:`~estimator_keras.engines.keras_setup.keras_api` when it runs:
``tf.keras`` where TensorFlow is installed (Keras 2 for the estimator and
keras engines, Keras 3 for keras3), else Keras 3's own ``keras`` package.
The experiment modules that name these builders are imported to list
experiments, which needs neither TensorFlow nor Keras.
"""

import logging

from estimator_keras.engines.keras_setup import keras_api
from estimator_keras.errors import ConfigError

logger = logging.getLogger("experiments")
_SAID = set()


def _say_once(message):
    """A builder runs several times a run (training, evaluation, export):
    what it chose is said the first time."""
    if message not in _SAID:
        _SAID.add(message)
        logger.info(message)


def _is_float(data):
    """Whether the dataset stores its input as floats (a description
    without dtypes, or none: integer pixels, as Fashion-MNIST's)."""
    dtype = str(getattr(data, "input_dtype", None) or "")
    return dtype.startswith(("float", "bfloat"))


def _input(keras, data, default_shape):
    if data is None:
        return keras.Input(shape=default_shape, name="image")
    return keras.Input(shape=data.input_shape, name=data.input_name)


def num_classes(hparams, data, default):
    """The number of classes: ``num_classes`` in the hparams when set, else
    what the dataset records, else (no data at all) ``default``."""
    if hparams.get("num_classes"):
        return int(hparams["num_classes"])
    if data is None:
        return default
    if not data.num_classes:
        raise ConfigError(
            "the dataset does not record how many classes its label has (it was written by "
            "an older version, or by write_records without labels): rerun `python -m "
            "experiments prepare ... --force`, or give --hparams num_classes=N.")
    return int(data.num_classes)


def seed_cnn(hparams, data=None):
    """The seed answer's CNN: Conv 32 -> Conv 64 -> MaxPool -> Dropout ->
    Flatten -> Dense 128 -> Dropout -> Dense (softmax)."""
    keras = keras_api()

    layers = keras.layers
    inputs = _input(keras, data, (28, 28, 1))
    x = layers.Rescaling(1.0 / 255)(inputs)
    x = layers.Conv2D(hparams.get("filters", 32), 3, activation="relu")(x)
    x = layers.Conv2D(2 * hparams.get("filters", 32), 3, activation="relu")(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Dropout(hparams.get("conv_dropout", 0.25))(x)
    x = layers.Flatten()(x)
    x = layers.Dense(hparams.get("dense_units", 128), activation="relu")(x)
    x = layers.Dropout(hparams.get("dropout", 0.5))(x)
    outputs = layers.Dense(num_classes(hparams, data, 10), activation="softmax",
                           name="probabilities")(x)
    return keras.Model(inputs, outputs, name="seed_cnn")


def seed_mlp(hparams, data=None):
    """The seed question's MLP: Dense 128 -> Dense 128 -> Dense (softmax)."""
    keras = keras_api()

    layers = keras.layers
    inputs = _input(keras, data, (28, 28, 1))
    x = layers.Rescaling(1.0 / 255)(inputs)
    x = layers.Flatten()(x)
    x = layers.Dense(hparams.get("units", 128), activation="relu")(x)
    x = layers.Dense(hparams.get("units", 128), activation="relu")(x)
    outputs = layers.Dense(num_classes(hparams, data, 10), activation="softmax",
                           name="probabilities")(x)
    return keras.Model(inputs, outputs, name="seed_mlp")


def image_classifier(hparams, data=None):
    """A classifier sized from its input.

    The dataset's dtype decides what the input is. Integer images (height
    x width x channels, or height x width: pixels 0-255): a small conv net
    on the pixels scaled by 1/255, blocks of two 3x3 convolutions and a 2x2
    max-pool, filters doubling, until the feature map is about 8 pixels
    across (2 blocks for 28x28, 5 for 224x224; ``blocks`` overrides), then
    global average pooling, dropout and a softmax. Float values of height x
    width x channels: the same conv net on the values batch-normalized
    (their scale is unknown).

    Vectors (one number or a list per example, e.g. float features from
    ``prepare tfrecords --features``), and float matrices (height x width
    with no channel axis: features, not a grey image), flattened: an MLP,
    batch normalization of the raw values (they have no known scale, unlike
    pixels), then ``blocks`` (default 2) Dense layers of ``4 * filters``
    units with dropout, and a softmax. The choice is logged once.
    """
    keras = keras_api()

    layers = keras.layers
    inputs = _input(keras, data, (28, 28, 1))
    rank = len(inputs.shape) - 1
    floats = _is_float(data)
    what = (f"input {inputs.name!r} of shape {list(inputs.shape[1:])}, "
            f"{'float' if floats else 'integer'} values")
    if rank <= 1 or (rank == 2 and floats):
        _say_once(f"image_classifier: an MLP on the {what}, flattened and batch-normalized")
        return _vector_classifier(keras, inputs, hparams, data)
    if rank > 3:
        raise ConfigError(
            f"image_classifier takes images (height x width x channels, or height x width) "
            f"or vectors; input {inputs.name!r} has shape {list(inputs.shape[1:])}. Reshape "
            f"the records to one of those, or register an experiment with your own model "
            f"(see `python -m experiments --module`).")
    size = min(inputs.shape[1], inputs.shape[2])
    blocks = hparams.get("blocks") or max(1, min(5, (size // 8).bit_length()))
    count = f"{int(blocks)} block" + ("s" if int(blocks) != 1 else "")
    _say_once(f"image_classifier: a conv net of {count} on the {what}, "
              + ("batch-normalized" if floats else "pixels scaled by 1/255"))
    x = layers.BatchNormalization()(inputs) if floats else layers.Rescaling(1.0 / 255)(inputs)
    if rank == 2:  # a grey image stored without its channel axis
        x = layers.Reshape((*inputs.shape[1:], 1))(x)
    for block in range(int(blocks)):
        filters = hparams.get("filters", 32) * 2 ** block
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D(2)(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(hparams.get("dropout", 0.3))(x)
    outputs = layers.Dense(num_classes(hparams, data, 10), activation="softmax",
                           name="probabilities")(x)
    return keras.Model(inputs, outputs, name="image_classifier")


def _vector_classifier(keras, inputs, hparams, data):
    layers = keras.layers
    # A scalar feature is a vector of one; a matrix of features is flattened.
    x = layers.Reshape((1,))(inputs) if len(inputs.shape) == 1 else inputs
    if len(inputs.shape) > 2:
        x = layers.Flatten()(x)
    x = layers.BatchNormalization()(x)
    for _ in range(int(hparams.get("blocks") or 2)):
        x = layers.Dense(4 * hparams.get("filters", 32), activation="relu")(x)
        x = layers.Dropout(hparams.get("dropout", 0.3))(x)
    outputs = layers.Dense(num_classes(hparams, data, 10), activation="softmax",
                           name="probabilities")(x)
    return keras.Model(inputs, outputs, name="image_classifier")


def unet(hparams, data=None):
    """A U-Net: ``depth`` down and up stages with skip connections (default:
    as deep as the input divides by 2, at most 4), per-pixel softmax over the
    mask's classes."""
    keras = keras_api()

    layers = keras.layers
    base = hparams.get("filters", 16)
    inputs = _input(keras, data, (64, 64, 3))
    height, width = inputs.shape[1], inputs.shape[2]
    depth = hparams.get("depth") or max(d for d in range(5) if height % 2 ** d == 0
                                        and width % 2 ** d == 0 and min(height, width) >> d >= 4)
    if height % 2 ** depth or width % 2 ** depth:
        raise ConfigError(f"a U-Net of depth {depth} needs an input whose height and width "
                          f"divide by {2 ** depth}; the data is {height}x{width}. Prepare it with "
                          f"--image-size, or set --hparams depth=N.")

    def block(x, filters):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        return layers.Conv2D(filters, 3, padding="same", activation="relu")(x)

    x = layers.Rescaling(1.0 / 255)(inputs)
    skips = []
    for level in range(depth):
        x = block(x, base * 2 ** level)
        skips.append(x)
        x = layers.MaxPooling2D(2)(x)
    x = block(x, base * 2 ** depth)
    for level in reversed(range(depth)):
        x = layers.Conv2DTranspose(base * 2 ** level, 2, strides=2, padding="same")(x)
        x = layers.Concatenate()([x, skips[level]])
        x = block(x, base * 2 ** level)
    outputs = layers.Conv2D(num_classes(hparams, data, 4), 1, activation="softmax",
                            name="mask")(x)
    return keras.Model(inputs, outputs, name="unet")
