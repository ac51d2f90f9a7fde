"""Mixed-precision training: which compute dtype to train in, and the model
builder that trains in it.

Only training runs in a reduced precision. Variables stay float32 under
every policy, so checkpoints are interchangeable between precisions, and
exports and evaluations of the same checkpoint may build the model in
float32.
"""

import importlib.util
import os

from estimator_keras.errors import ConfigError

FLOAT32 = "float32"
MIXED_BFLOAT16 = "mixed_bfloat16"
AUTO = "auto"
CHOICES = (FLOAT32, MIXED_BFLOAT16, AUTO)

# CPU flags (as /proc/cpuinfo spells them) of native bfloat16 arithmetic,
# where oneDNN runs bfloat16 matmuls and convolutions faster than float32.
# Without them bfloat16 is emulated and slower, so "auto" stays float32.
_BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_bfloat16_flags(cpuinfo="/proc/cpuinfo"):
    """The native-bfloat16 flags this CPU reports (empty when none, or where
    ``cpuinfo`` cannot be read, e.g. off Linux)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[-1].split())
                    return tuple(flag for flag in _BF16_CPU_FLAGS if flag in flags)
    except OSError:
        pass
    return ()


def resolve(precision, has_gpu=None, cpuinfo="/proc/cpuinfo", no_bfloat16=""):
    """``(policy, reason)`` for ``precision`` ("float32", "mixed_bfloat16" or
    "auto"). "auto" picks mixed_bfloat16 on a CPU with native bfloat16 and no
    GPU (faster than float32 there: BENCHMARKS.md, the accuracy table);
    float32 anywhere else, GPUs included, where it has not been measured.
    ``no_bfloat16``: why this run cannot train in bfloat16 (its engine and
    strategy), "" where it can: then "auto" is float32 and mixed_bfloat16 a
    ConfigError."""
    if precision not in CHOICES:
        raise ConfigError(f"precision must be one of {', '.join(CHOICES)}; got {precision!r}")
    if precision == MIXED_BFLOAT16 and no_bfloat16:
        raise ConfigError(f"precision mixed_bfloat16 cannot train here: {no_bfloat16}. Use "
                          f"--precision float32 (or auto, which picks it), or another strategy "
                          f"or engine.")
    if precision != AUTO:
        return precision, "as configured"
    if no_bfloat16:
        return FLOAT32, no_bfloat16
    if has_gpu is None and importlib.util.find_spec("tensorflow") is None:
        # Its gain was measured on TensorFlow's oneDNN kernels only.
        return FLOAT32, "TensorFlow is not installed: auto picks bfloat16 for its oneDNN kernels"
    if has_gpu is None:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        has_gpu = bool(tf.config.list_physical_devices("GPU"))
    if has_gpu:
        return FLOAT32, "a GPU is present (auto picks bfloat16 only on CPUs with native support)"
    if os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1") in ("0", "false", "False"):
        # The bfloat16 kernels that make it worth it are oneDNN's.
        return FLOAT32, "oneDNN is off (TF_ENABLE_ONEDNN_OPTS=0)"
    flags = cpu_bfloat16_flags(cpuinfo)
    if flags:
        return MIXED_BFLOAT16, f"this CPU computes bfloat16 natively ({', '.join(flags)})"
    return FLOAT32, f"this CPU has no native bfloat16 ({' or '.join(_BF16_CPU_FLAGS)})"


def with_policy(build_model, policy):
    """A builder of ``build_model``'s model that computes in ``policy``.

    Under mixed_bfloat16 the model is built under that global policy and its
    last layer is rebuilt in float32, so the outputs (a softmax, usually) and
    the loss are computed in float32, as Keras advises for mixed precision.
    The layers keep their names, so variables and checkpoints match a float32
    build of the same model.
    """
    if policy == FLOAT32:
        return build_model

    def build():
        # pylint: disable-next=import-outside-toplevel  (TensorFlow, where installed)
        from estimator_keras.engines.keras_setup import keras_api
        keras = keras_api()

        previous = keras.mixed_precision.global_policy()
        keras.mixed_precision.set_global_policy(policy)
        try:
            model = build_model()
        finally:
            keras.mixed_precision.set_global_policy(previous)
        last = model.layers[-1]

        def clone(layer):
            config = layer.get_config()
            if layer is last:
                config["dtype"] = FLOAT32
            return layer.__class__.from_config(config)

        return keras.models.clone_model(model, clone_function=clone)

    return build

