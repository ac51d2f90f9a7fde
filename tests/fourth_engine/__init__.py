"""A fourth engine that only the tests register: one folder (this one) and
one registry entry, as a new engine of the package would be. It trains
with the Keras this environment has (Keras 3 where it runs, on the
TensorFlow backend only; else Keras 2) through a loop of its own
(:mod:`.engine`), and writes TensorFlow checkpoints of its own layout,
which its entry claims.

Importing it imports no TensorFlow (the CLI can still choose tf.keras
afterwards) and registers nothing: :func:`register` does, in the process
that asks for it.
"""

from estimator_keras import io
from estimator_keras.engines import keras_setup, registry
from estimator_keras.errors import EngineMismatchError

NAME = "fourth"
KERAS = 3 if keras_setup.no_keras3_message() is None else 2
CHECKPOINT_NAME = "fourth.ckpt"
# What tells its checkpoints from every other engine's.
STEP_KEY = "fourth_engine_step/.ATTRIBUTES/VARIABLE_VALUE"
# Its loop is tf.GradientTape: on Keras 3 it computes on the TensorFlow backend only.
BACKENDS = (registry.Backend("tensorflow", ("tensorflow",), "pip install -e '.[cpu]'",
                             distributions=keras_setup.TENSORFLOW_DISTRIBUTIONS),)
REFUSED_BACKENDS = (("jax", "its training loop is tf.GradientTape, which computes on "
                            "TensorFlow only"),)


def _status(tf_version):
    return True, f"available (the tests' fourth engine, Keras {KERAS}, TensorFlow {tf_version})"


def claims(reader):
    """True for a TensorFlow checkpoint this engine wrote."""
    return reader.has_tensor(STEP_KEY)


def _refuse_model_dir(model_dir, engine):
    raise EngineMismatchError(
        f"{model_dir} was trained by the {NAME} engine: its checkpoints "
        f"({io.join(model_dir, CHECKPOINT_NAME)}-N) hold its own loop's model, optimizer and "
        f"step, which the {engine} engine does not continue. Use --engine {NAME} (or auto) "
        f"for this model dir, or start a new --model-dir.")


ENTRY = registry.Entry(
    name=NAME,
    engine="fourth_engine.engine:FourthEngine",
    summary="the test suite's fourth engine: a tf.GradientTape loop of its own",
    status=_status,
    keras=KERAS,
    cluster=registry.Cluster(("chief",), ("none",), "trains in one process"),
    keras_backends=BACKENDS if KERAS == 3 else (),
    refused_backends=REFUSED_BACKENDS if KERAS == 3 else (),
    job_kinds=("vertex",),
    image_hint="an image with this package and the tests' fourth engine installed",
    claims=claims,
    refuse_model_dir=_refuse_model_dir,
)


def register():
    registry.register(ENTRY)
