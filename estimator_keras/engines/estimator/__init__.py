"""The estimator engine: ``tf.keras.estimator.model_to_estimator`` and
``tf.estimator.train_and_evaluate`` (TensorFlow <= 2.15 with
``tensorflow-estimator``), in :mod:`.engine`; its checkpoints in
:mod:`.checkpoints`, its cross-replica sums in :mod:`.sums`.

This module is the engine's registry entry only: it imports no TensorFlow.
"""

from estimator_keras.engines import keras_setup
from estimator_keras.engines.registry import TENSORFLOW_RUNTIME, Cluster, Entry


def _status(tf_version):
    estimator = keras_setup.installed_version("tensorflow-estimator")
    if keras_setup.version_tuple(tf_version) >= (2, 16):
        return False, (f"not available: tf.estimator ended with TensorFlow 2.15 (this is "
                       f"{tf_version})")
    if not estimator:
        return False, "not available: tensorflow-estimator is not installed"
    return True, f"available (TensorFlow {tf_version}, tensorflow-estimator {estimator})"


def _cannot_run():
    """Why tf.estimator does not import in this process, or ""."""
    import importlib.util  # pylint: disable=import-outside-toplevel
    from estimator_keras import engines  # pylint: disable=import-outside-toplevel
    if engines.estimator_available():
        return ""
    installed = importlib.util.find_spec("tensorflow_estimator") is not None
    return (f"the estimator engine needs tf.estimator, which ended with TensorFlow 2.15 and "
            f"tensorflow-estimator 2.15 (this is TensorFlow {engines.tensorflow_version()}"
            f"{'' if installed else ', without tensorflow-estimator'}); it runs with "
            f"tensorflow-cpu==2.15.* and tensorflow-estimator==2.15.* on Python <= 3.11.")


def _claims(reader):
    from estimator_keras.engines.estimator import checkpoints  # pylint: disable=import-outside-toplevel
    return checkpoints.claims(reader)


def _layers(model):
    """Every layer of ``model``, those of nested models included."""
    for layer in model.layers:
        yield layer
        yield from _layers(layer) if hasattr(layer, "layers") else ()


def _no_bfloat16(strategy, model):
    # Found by a 3-pod TrainJob test: in a TF_CONFIG cluster the Estimator's
    # graph runs on TensorFlow's distributed runtime, which fuses convolutions
    # into _FusedConv2D, an op TensorFlow 2.15 has no bfloat16 CPU kernel for.
    # One process (none, mirrored), and models without convolutions, train in
    # bfloat16.
    if strategy not in ("multi_worker_mirrored", "parameter_server"):
        return ""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (only when training)
    layers = tf.keras.layers
    convolutions = (layers.Conv1D, layers.Conv2D, layers.Conv3D, layers.SeparableConv1D,
                    layers.SeparableConv2D, layers.DepthwiseConv2D)
    if not any(isinstance(layer, convolutions) for layer in _layers(model)):
        return ""
    return ("TensorFlow 2.15's Estimator in a cluster runs convolutions fused (_FusedConv2D), "
            "which have no bfloat16 CPU kernel")


ENTRY = Entry(
    name="estimator",
    engine="estimator_keras.engines.estimator.engine:EstimatorEngine",
    summary="tf.estimator's train_and_evaluate of a model_to_estimator Estimator "
            "(TensorFlow 2.15, Python <= 3.11)",
    status=_status,
    keras=2,
    cluster=Cluster(("chief", "worker", "ps", "evaluator"),
                    ("none", "mirrored", "multi_worker_mirrored", "parameter_server"),
                    where=" (TensorFlow 2.15)"),
    job_kinds=("vertex", "trainjob", "tfjob", "katib"),
    no_bfloat16=_no_bfloat16,
    trainjob_runtime=TENSORFLOW_RUNTIME,
    prebuilt_image="2-15",
    claims=_claims,
    auto=1,
    auto_when="where available",
    cannot_run=_cannot_run,
    packages=(("tensorflow", keras_setup.TENSORFLOW_DISTRIBUTIONS), ("keras", ("keras",))),
)
