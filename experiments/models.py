"""Model builders shared by the experiments.

Every builder returns an uncompiled functional Keras model whose inputs take
the records' raw values (pixels 0-255) and scale them inside the model, so an
exported model predicts correctly for a user who knows nothing of the input
pipeline. Only built-in Keras layers are used: ``model.h5`` then loads with
``tf.keras.models.load_model(path, compile=False)`` and no custom objects.

TensorFlow is imported inside each builder: the experiment modules that name
these builders are imported to list experiments, which needs no TensorFlow.
"""


def seed_cnn(hparams, input_shape=(28, 28, 1), num_classes=10, input_name="image"):
    """The seed answer's CNN: Conv 32 -> Conv 64 -> MaxPool -> Dropout ->
    Flatten -> Dense 128 -> Dropout -> Dense (softmax)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (see above)

    layers = tf.keras.layers
    inputs = tf.keras.Input(shape=input_shape, name=input_name)
    x = layers.Rescaling(1.0 / 255)(inputs)
    x = layers.Conv2D(hparams.get("filters", 32), 3, activation="relu")(x)
    x = layers.Conv2D(2 * hparams.get("filters", 32), 3, activation="relu")(x)
    x = layers.MaxPooling2D(2)(x)
    x = layers.Dropout(hparams.get("conv_dropout", 0.25))(x)
    x = layers.Flatten()(x)
    x = layers.Dense(hparams.get("dense_units", 128), activation="relu")(x)
    x = layers.Dropout(hparams.get("dropout", 0.5))(x)
    outputs = layers.Dense(num_classes, activation="softmax", name="probabilities")(x)
    return tf.keras.Model(inputs, outputs, name="seed_cnn")


def seed_mlp(hparams, input_shape=(28, 28, 1), num_classes=10, input_name="image"):
    """The seed question's MLP: Dense 128 -> Dense 128 -> Dense (softmax)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (see above)

    layers = tf.keras.layers
    inputs = tf.keras.Input(shape=input_shape, name=input_name)
    x = layers.Rescaling(1.0 / 255)(inputs)
    x = layers.Flatten()(x)
    x = layers.Dense(hparams.get("units", 128), activation="relu")(x)
    x = layers.Dense(hparams.get("units", 128), activation="relu")(x)
    outputs = layers.Dense(num_classes, activation="softmax", name="probabilities")(x)
    return tf.keras.Model(inputs, outputs, name="seed_mlp")


def small_unet(hparams, input_shape=(64, 64, 3), num_classes=4, input_name="image"):
    """A small U-Net: three down and three up stages with skip connections,
    per-pixel softmax over ``num_classes``."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (see above)

    layers = tf.keras.layers
    base = hparams.get("filters", 16)

    def block(x, filters):
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        return layers.Conv2D(filters, 3, padding="same", activation="relu")(x)

    inputs = tf.keras.Input(shape=input_shape, name=input_name)
    x = layers.Rescaling(1.0 / 255)(inputs)
    skips = []
    for depth in range(3):
        x = block(x, base * 2 ** depth)
        skips.append(x)
        x = layers.MaxPooling2D(2)(x)
    x = block(x, base * 8)
    for depth in reversed(range(3)):
        x = layers.Conv2DTranspose(base * 2 ** depth, 2, strides=2, padding="same")(x)
        x = layers.Concatenate()([x, skips[depth]])
        x = block(x, base * 2 ** depth)
    outputs = layers.Conv2D(num_classes, 1, activation="softmax", name="mask")(x)
    return tf.keras.Model(inputs, outputs, name="small_unet")
