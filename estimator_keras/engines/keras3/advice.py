"""Advice for a keras3 setup known to be much slower than another for a
model: JAX on the CPU for convolutions."""

import importlib.util

# Keras 3 convolution layers, by their public names.
CONVOLUTIONS = ("Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose",
                "Conv3DTranspose", "DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D",
                "SeparableConv2D")
# fashion_mnist_cnn on the keras3 engine on 2-core CPUs: 2.9 steps/s on JAX
# against 23 on TensorFlow as a user measured it, and the keras table of
# BENCHMARKS.md (seed_cnn keras3[jax] engine 4.25, keras3 engine 11.70).
SLOW_JAX_CPU = (
    "this model has convolution layers, and Keras 3's JAX backend runs convolutions on the "
    "CPU several times slower than TensorFlow's: fashion_mnist_cnn trained at 2.9 steps/s on "
    "JAX against 23 on TensorFlow on a 2-core CPU (about 8x; BENCHMARKS.md's keras table: 4.25 "
    "against 11.70).")


def _layers(layer):
    for sub in getattr(layer, "layers", None) or ():
        yield sub
        yield from _layers(sub)


def slow_backend_warning(backend, platform, model, processes=1):
    """A warning for a backend known to be much slower on this hardware for
    ``model``: JAX on the CPU for a model with convolutions; else None.
    ``processes``: how many train together (Keras 3 trains several on JAX only)."""
    if backend != "jax" or platform != "cpu":
        return None
    import keras  # pylint: disable=import-outside-toplevel  (Keras 3: the JAX backend's)
    convolutions = tuple(getattr(keras.layers, name) for name in CONVOLUTIONS
                         if hasattr(keras.layers, name))
    if not any(isinstance(layer, convolutions) for layer in _layers(model)):
        return None
    if importlib.util.find_spec("tensorflow") is None:
        return (f"warning: {SLOW_JAX_CPU} Install TensorFlow (pip install -e '.[cpu]') and set "
                f"KERAS_BACKEND=tensorflow to train it on TensorFlow.")
    if processes > 1:
        return (f"warning: {SLOW_JAX_CPU} Train it in one process with KERAS_BACKEND=tensorflow, "
                f"or as a cluster with --engine keras.")
    return f"warning: {SLOW_JAX_CPU} Set KERAS_BACKEND=tensorflow to train it on TensorFlow."
