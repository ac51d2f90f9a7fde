"""Four models as keras.io's Keras 3 examples write them, as a user's
``--module``: ``python -m experiments --module tests/keras_io_gallery.py ...``.

- ``gallery_mnist_convnet``: "Simple MNIST convnet" (a Sequential model).
- ``gallery_from_scratch``: "Image classification from scratch": the
  augmentation block inside the model, an Xception-style residual net, and
  logits out (``Dense(units, activation=None)`` with ``from_logits=True``).
- ``gallery_transfer``: "Transfer learning & fine-tuning": a base model
  frozen (``trainable = False``, called with ``training=False``) under a new
  head; the base is built in code here, where keras.io downloads Xception.
- ``gallery_custom_fit``: "Customizing what happens in ``fit()``": a
  functional model whose class overrides ``train_step``, in the form keras.io
  writes for the backend that runs it (TensorFlow or JAX).

The models are the examples' own, sized down by their hyperparameters so
that each trains in seconds on a CPU. Where the examples scale their arrays
before ``fit``, the models here begin with ``Rescaling``, since they are fed
raw pixels. The data: small RGB images, whose class is the colour of a
square at a random place.
"""

import numpy as np

from experiments import (DataConfig, Experiment, ExperimentConfig, TrainConfig, register,
                         register_dataset)

CLASSES = ["red", "green", "blue"]
SIZE = 16


def coloured_squares(source_dir=None, download_dir=None):
    """{split: {"image", "label"}}: grey noise with one square of the class's
    colour at a random place."""
    del source_dir, download_dir
    rng = np.random.default_rng(0)

    def split(n):
        labels = rng.integers(0, len(CLASSES), n)
        images = rng.integers(0, 90, (n, SIZE, SIZE, 3)).astype(np.uint8)
        for image, label in zip(images, labels):
            top, left = rng.integers(0, SIZE - 7, 2)
            image[top:top + 7, left:left + 7, label] += 150
        return {"image": images, "label": labels}

    return {"train": split(960), "test": split(240)}


register_dataset("coloured_squares", "16x16 RGB noise with a red, green or blue square",
                 coloured_squares,
                 labels={"label": {"num_classes": len(CLASSES), "class_names": CLASSES}})


# -- Simple MNIST convnet


def mnist_convnet(hparams, data):
    import keras
    from keras import layers

    input_shape, num_classes = data.input_shape, data.num_classes
    model = keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.Rescaling(1.0 / 255),
            layers.Conv2D(hparams["filters"], kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(2 * hparams["filters"], kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dropout(0.5),
            layers.Dense(num_classes, activation="softmax"),
        ]
    )
    return model


# -- Image classification from scratch


def make_model(hparams, data):
    import keras
    from keras import layers

    input_shape, num_classes = data.input_shape, data.num_classes
    data_augmentation_layers = [
        layers.RandomFlip("horizontal"),
        layers.RandomRotation(0.1),
    ]

    def data_augmentation(images):
        for layer in data_augmentation_layers:
            images = layer(images)
        return images

    inputs = keras.Input(shape=input_shape)
    x = data_augmentation(inputs)

    # Entry block
    x = layers.Rescaling(1.0 / 255)(x)
    x = layers.Conv2D(hparams["entry"], 3, strides=2, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)

    previous_block_activation = x  # Set aside residual

    for size in hparams["sizes"]:
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)

        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)

        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)

        # Project residual
        residual = layers.Conv2D(size, 1, strides=2, padding="same")(
            previous_block_activation
        )
        x = layers.add([x, residual])  # Add back residual
        previous_block_activation = x  # Set aside next residual

    x = layers.SeparableConv2D(hparams["exit"], 3, padding="same")(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)

    x = layers.GlobalAveragePooling2D()(x)
    if num_classes == 2:
        units = 1
    else:
        units = num_classes

    x = layers.Dropout(0.25)(x)
    # We specify activation=None so as to return logits
    outputs = layers.Dense(units, activation=None)(x)
    return keras.Model(inputs, outputs)


# -- Transfer learning with a frozen base


def transfer_model(hparams, data):
    import keras

    # keras.io: keras.applications.Xception(weights="imagenet", include_top=False).
    inputs = keras.Input(shape=data.input_shape)
    features = keras.layers.Conv2D(hparams["filters"], 3, activation="relu")(inputs)
    features = keras.layers.Conv2D(hparams["filters"], 3, activation="relu")(features)
    base_model = keras.Model(inputs, features, name="base_model")

    # Freeze the base_model
    base_model.trainable = False

    # Create new model on top
    inputs = keras.Input(shape=data.input_shape)
    scale_layer = keras.layers.Rescaling(scale=1 / 127.5, offset=-1)
    x = scale_layer(inputs)

    # The base model contains batchnorm layers. We want to keep them in inference mode
    # when we unfreeze the base model for fine-tuning, so we make sure that the
    # base_model is running in inference mode here.
    x = base_model(x, training=False)
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.2)(x)  # Regularize with dropout
    outputs = keras.layers.Dense(data.num_classes)(x)
    return keras.Model(inputs, outputs)


# -- Customizing what happens in fit()


def _custom_model_class():
    """keras.io's ``CustomModel`` for the backend that trains it."""
    import keras

    if keras.backend.backend() == "jax":
        import jax

        class CustomModel(keras.Model):
            def compute_loss_and_updates(
                self,
                trainable_variables,
                non_trainable_variables,
                x,
                y,
                training=False,
            ):
                y_pred, non_trainable_variables = self.stateless_call(
                    trainable_variables,
                    non_trainable_variables,
                    x,
                    training=training,
                )
                loss = self.compute_loss(x, y, y_pred)
                return loss, (y_pred, non_trainable_variables)

            def train_step(self, state, data):
                (
                    trainable_variables,
                    non_trainable_variables,
                    optimizer_variables,
                    metrics_variables,
                ) = state
                x, y = data

                # Get the gradient function.
                grad_fn = jax.value_and_grad(self.compute_loss_and_updates, has_aux=True)

                # Compute the gradients.
                (loss, (y_pred, non_trainable_variables)), grads = grad_fn(
                    trainable_variables,
                    non_trainable_variables,
                    x,
                    y,
                    training=True,
                )

                # Update trainable variables and optimizer variables.
                (
                    trainable_variables,
                    optimizer_variables,
                ) = self.optimizer.stateless_apply(
                    optimizer_variables, grads, trainable_variables
                )

                # Update metrics.
                new_metrics_vars = []
                logs = {}
                for metric in self.metrics:
                    this_metric_vars = metrics_variables[
                        len(new_metrics_vars) : len(new_metrics_vars) + len(metric.variables)
                    ]
                    if metric.name == "loss":
                        this_metric_vars = metric.stateless_update_state(this_metric_vars, loss)
                    else:
                        this_metric_vars = metric.stateless_update_state(
                            this_metric_vars, y, y_pred
                        )
                    logs[metric.name] = metric.stateless_result(this_metric_vars)
                    new_metrics_vars += this_metric_vars

                # Return metric logs and updated state variables.
                state = (
                    trainable_variables,
                    non_trainable_variables,
                    optimizer_variables,
                    new_metrics_vars,
                )
                return logs, state

            # keras.io's evaluation step of the same guide: Keras' own
            # test_step calls compute_loss_and_updates, overridden above.
            def test_step(self, state, data):
                # Unpack the data.
                x, y = data
                (
                    trainable_variables,
                    non_trainable_variables,
                    metrics_variables,
                ) = state

                # Compute predictions and loss.
                y_pred, non_trainable_variables = self.stateless_call(
                    trainable_variables,
                    non_trainable_variables,
                    x,
                    training=False,
                )
                loss = self.compute_loss(x, y, y_pred)

                # Update metrics.
                new_metrics_vars = []
                logs = {}
                for metric in self.metrics:
                    this_metric_vars = metrics_variables[
                        len(new_metrics_vars) : len(new_metrics_vars) + len(metric.variables)
                    ]
                    if metric.name == "loss":
                        this_metric_vars = metric.stateless_update_state(this_metric_vars, loss)
                    else:
                        this_metric_vars = metric.stateless_update_state(
                            this_metric_vars, y, y_pred
                        )
                    logs[metric.name] = metric.stateless_result(this_metric_vars)
                    new_metrics_vars += this_metric_vars

                # Return metric logs and updated state variables.
                state = (
                    trainable_variables,
                    non_trainable_variables,
                    new_metrics_vars,
                )
                return logs, state

        return CustomModel

    import tensorflow as tf

    class CustomModel(keras.Model):
        def train_step(self, data):
            # Unpack the data. Its structure depends on your model and
            # on what you pass to `fit()`.
            x, y = data

            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)  # Forward pass
                # Compute the loss value
                # (the loss function is configured in `compile()`)
                loss = self.compute_loss(y=y, y_pred=y_pred)

            # Compute gradients
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)

            # Update weights
            self.optimizer.apply(gradients, trainable_vars)

            # Update metrics (includes the metric that tracks the loss)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)

            # Return a dict mapping metric names to current value
            return {m.name: m.result() for m in self.metrics}

    return CustomModel


def custom_fit_model(hparams, data):
    import keras

    inputs = keras.Input(shape=data.input_shape)
    x = keras.layers.Rescaling(1.0 / 255)(inputs)
    x = keras.layers.Conv2D(hparams["filters"], 3, activation="relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    outputs = keras.layers.Dense(data.num_classes, activation="softmax")(x)
    return _custom_model_class()(inputs, outputs)


# -- the experiments

LOGITS = {"name": "sparse_categorical_crossentropy", "from_logits": True}
# name: description, builder, model hparams, loss, learning rate, steps. The
# residual net's BatchNormalization keeps keras.io's momentum (0.99): its
# moving variance, which inference uses, is near the data's only after a few
# hundred steps (at 300 it still holds 0.99**300 = 5% of its initial 1).
GALLERY = {
    "gallery_mnist_convnet": ("keras.io: Simple MNIST convnet", mnist_convnet,
                              {"filters": 8}, "sparse_categorical_crossentropy", 3e-3, 90),
    "gallery_from_scratch": ("keras.io: Image classification from scratch (logits)",
                             make_model, {"entry": 8, "sizes": [8, 16], "exit": 16},
                             LOGITS, 3e-3, 450),
    "gallery_transfer": ("keras.io: Transfer learning, a frozen base under a new head",
                         transfer_model, {"filters": 32}, LOGITS, 3e-2, 100),
    "gallery_custom_fit": ("keras.io: Customizing what happens in fit()", custom_fit_model,
                           {"filters": 16}, "sparse_categorical_crossentropy", 1e-2, 90),
}

for _name, (_description, _builder, _model, _loss, _rate, _steps) in GALLERY.items():
    register(Experiment(
        config=ExperimentConfig(
            name=_name, description=_description,
            data=DataConfig(dataset="coloured_squares"),
            train=TrainConfig(batch_size=32, max_steps=_steps, eval_every_steps=_steps,
                              log_every_steps=_steps, learning_rate=_rate, seed=1),
            model=_model, loss=_loss),
        build_model=_builder))
