"""Mixed precision: what "auto" picks, and builders whose variables match a
float32 build."""

import numpy as np
import pytest

from estimator_keras import precision
from estimator_keras.errors import ConfigError


def _cpuinfo(tmp_path, name, flags):
    path = tmp_path / name
    path.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 avx2 {flags}\n")
    return str(path)


def test_auto_picks_bfloat16_only_on_a_cpu_that_has_it(tmp_path, monkeypatch):
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    with_bf16 = _cpuinfo(tmp_path, "bf16", "avx512f avx512_bf16")
    without = _cpuinfo(tmp_path, "plain", "avx512f")
    policy, reason = precision.resolve("auto", has_gpu=False, cpuinfo=with_bf16)
    assert policy == "mixed_bfloat16" and "avx512_bf16" in reason
    assert precision.resolve("auto", has_gpu=False, cpuinfo=without)[0] == "float32"
    assert precision.resolve("auto", has_gpu=True, cpuinfo=with_bf16)[0] == "float32"
    assert precision.resolve("auto", has_gpu=False, cpuinfo=str(tmp_path / "none"))[0] == \
        "float32"
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    assert precision.resolve("auto", has_gpu=False, cpuinfo=with_bf16)[0] == "float32"
    # An explicit choice is kept whatever the machine.
    assert precision.resolve("mixed_bfloat16", cpuinfo=without)[0] == "mixed_bfloat16"


def test_an_engine_and_strategy_without_bfloat16_keep_auto_float32_and_refuse_bfloat16(
        tmp_path, monkeypatch):
    import tensorflow as tf
    from estimator_keras.engines import registry
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    with_bf16 = _cpuinfo(tmp_path, "bf16", "avx512f avx512_bf16")
    inputs = tf.keras.Input((8, 8, 1))
    cnn = tf.keras.Model(inputs, tf.keras.layers.Dense(2)(tf.keras.layers.Flatten()(
        tf.keras.layers.Conv2D(4, 3)(inputs))))
    inputs = tf.keras.Input((4,))
    mlp = tf.keras.Model(inputs, tf.keras.layers.Dense(2)(inputs))
    # A convolution inside a nested model counts too.
    inputs = tf.keras.Input((8, 8, 1))
    nested = tf.keras.Model(inputs, tf.keras.layers.Dense(2)(tf.keras.layers.Flatten()(
        cnn(inputs))))
    refuses = registry.get("estimator").no_bfloat16
    why = refuses("multi_worker_mirrored", cnn)
    assert "_FusedConv2D" in why and refuses("parameter_server", cnn) == why
    assert refuses("none", cnn) == refuses("mirrored", cnn) == ""
    assert refuses("multi_worker_mirrored", mlp) == ""
    assert refuses("multi_worker_mirrored", nested) == why
    assert precision.resolve("auto", has_gpu=False, cpuinfo=with_bf16,
                             no_bfloat16=why) == ("float32", why)
    with pytest.raises(ConfigError, match="mixed_bfloat16 cannot train here: TensorFlow 2.15"):
        precision.resolve("mixed_bfloat16", cpuinfo=with_bf16, no_bfloat16=why)
    assert precision.resolve("auto", has_gpu=False, cpuinfo=with_bf16,
                             no_bfloat16="")[0] == "mixed_bfloat16"


def test_an_unknown_precision_names_the_choices():
    with pytest.raises(ConfigError, match="precision must be one of float32, mixed_bfloat16, "
                                          "auto; got 'fp16'"):
        precision.resolve("fp16")


def test_a_bfloat16_build_computes_in_bfloat16_with_float32_variables_and_outputs():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    def build():
        inputs = tf.keras.Input((6,), name="x")
        hidden = tf.keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
        return tf.keras.Model(inputs, tf.keras.layers.Dense(3, activation="softmax",
                                                            name="probs")(hidden))

    tf.keras.utils.set_random_seed(0)
    mixed = precision.with_policy(build, "mixed_bfloat16")()
    assert tf.keras.mixed_precision.global_policy().name == "float32"
    assert mixed.get_layer("hidden").compute_dtype == "bfloat16"
    assert mixed.get_layer("probs").compute_dtype == "float32"
    assert all(v.dtype == tf.float32 for v in mixed.weights)
    plain = build()
    assert [w.shape for w in plain.weights] == [w.shape for w in mixed.weights]
    plain.set_weights(mixed.get_weights())
    x = np.random.default_rng(0).normal(size=(4, 6)).astype("float32")
    out = mixed(x).numpy()
    assert out.dtype == np.float32
    # bfloat16 keeps about 3 significant digits: close to, not equal to, float32.
    np.testing.assert_allclose(out, plain(x).numpy(), atol=0.05)
    assert precision.with_policy(build, "float32") is build
