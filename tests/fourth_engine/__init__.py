"""A fourth engine that only the tests register: one folder (this one) and
one registry entry, as a new engine of the package would be. It trains
with the Keras this environment has (Keras 3 where it runs, else Keras 2)
through the engine of that Keras, under its own name.

Importing it imports no TensorFlow (the CLI can still choose tf.keras
afterwards) and registers nothing: :func:`register` does, in the process
that asks for it.
"""

from estimator_keras.engines import keras_setup, registry

NAME = "fourth"
KERAS = 3 if keras_setup.no_keras3_message() is None else 2


def _status(tf_version):
    return True, f"available (the tests' fourth engine, Keras {KERAS}, TensorFlow {tf_version})"


ENTRY = registry.Entry(
    name=NAME,
    engine="fourth_engine.engine:FourthEngine",
    summary="the test suite's fourth engine: Model.fit under another name",
    status=_status,
    keras=KERAS,
    cluster=registry.Cluster(("chief",), ("none",), "trains in one process"),
    job_kinds=("vertex",),
    image_hint="an image with this package and the tests' fourth engine installed",
)


def register():
    registry.register(ENTRY)
