"""The keras engine: ``Model.fit`` of Keras 2 under ``tf.distribute``
strategies (any TensorFlow 2.15+; on 2.16+ with Keras 2 from the
``tf-keras`` package), in :mod:`.engine`. Its checkpoints are TensorFlow's
object-based checkpoints of the model and its optimizer.

This module is the engine's registry entry only: it imports no TensorFlow.
"""

from estimator_keras.engines import keras_setup
from estimator_keras.engines.registry import TENSORFLOW_RUNTIME, Cluster, Entry


def _status(tf_version):
    if keras_setup.version_tuple(tf_version) < (2, 16):
        return True, f"available (TensorFlow {tf_version}, its own Keras 2)"
    tf_keras = keras_setup.installed_version("tf-keras")
    if tf_keras:
        return True, f"available (TensorFlow {tf_version}, tf-keras {tf_keras})"
    return False, (f"not available: TensorFlow {tf_version} needs tf-keras for Keras 2 "
                   f"(pip install --no-deps "
                   f"'tf-keras~={'.'.join(tf_version.split('.')[:2])}.0')")


ENTRY = Entry(
    name="keras",
    engine="estimator_keras.engines.keras.engine:KerasEngine",
    summary="Keras 2's Model.fit under tf.distribute (TensorFlow 2.15-2.21 with tf-keras)",
    status=_status,
    keras=2,
    cluster=Cluster(("chief", "worker"), ("none", "mirrored", "multi_worker_mirrored"),
                    "trains with Model.fit under MultiWorkerMirroredStrategy and evaluates on "
                    "the chief"),
    job_kinds=("vertex", "trainjob", "tfjob", "katib"),
    trainjob_runtime=TENSORFLOW_RUNTIME,
    prebuilt_image="2-17",
    # The 2.17 image's own Keras is Keras 3; tf-keras 2.17 needs its tensorflow 2.17.
    image_requires=("tf-keras~=2.17.0",),
    # Its checkpoints are plain object-based checkpoints of the model and its
    # optimizer: every TensorFlow checkpoint no other engine claims.
    claims_the_rest=True,
    continues=("estimator",),
    auto=2,
    auto_when="where tf-keras is",
    packages=(("tensorflow", keras_setup.TENSORFLOW_DISTRIBUTIONS), ("keras", ("keras",)),
              ("tf_keras", ("tf-keras",))),
)
