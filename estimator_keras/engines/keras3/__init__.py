"""The keras3 engine: ``Model.fit`` of Keras 3 (TensorFlow 2.16+), on the
backend that ``KERAS_BACKEND`` names (tensorflow or jax), several processes
together on JAX; without TensorFlow, on JAX fed by Grain. Everything that
is this engine's lives here: training (:mod:`.engine`), evaluation
(:mod:`.evaluation`), its checkpoints (:mod:`.checkpoints`) and how a run
resumes from them (:mod:`.resume`), its exports (:mod:`.export`) and its
moves from the other engines' model dirs (:mod:`.migration`).

This module is the engine's registry entry only: it imports no TensorFlow,
Keras or JAX.
"""

from estimator_keras.engines import keras_setup
from estimator_keras.engines.keras3 import checkpoints
from estimator_keras.engines.registry import Backend, Cluster, Entry
from estimator_keras.errors import ConfigError

MULTI_WORKER_ISSUE = "keras-team/keras#20585"
NO_TF_MULTI_WORKER = ("Keras 3's Model.fit does not run under TensorFlow's "
                      f"MultiWorkerMirroredStrategy ({MULTI_WORKER_ISSUE})")
# The backend on which several processes train together (jax.distributed
# with keras.distribution.DataParallel); a cloud job's default.
MULTI_PROCESS_BACKEND = "jax"


def _jax_devices():
    import jax  # pylint: disable=import-outside-toplevel  (once the engine runs)
    devices = jax.local_devices()
    return devices[0].platform, len(devices)


# The backends it trains on, installed from the package's checkout (not
# from an index); the first a cloud job's default.
BACKENDS = (
    Backend(MULTI_PROCESS_BACKEND, ("jax", "jaxlib"),
            "`pip install -e '.[jax]'` in the folder of your estimator-keras checkout",
            multi_process=True, devices=_jax_devices, pipelines=("tfdata", "grain")),
    Backend("tensorflow", ("tensorflow",),
            "`pip install -e '.[cpu]'` (or '.[gpu]') in the folder of your estimator-keras "
            "checkout", distributions=keras_setup.TENSORFLOW_DISTRIBUTIONS),
)
_INFERENCE_ONLY = "it only runs inference (it has no Model.fit)"
REFUSED_BACKENDS = (
    ("numpy", _INFERENCE_ONLY),
    ("openvino", _INFERENCE_ONLY),
    # It trains, but no engine here feeds it, and nothing here is tested on it.
    ("torch", "estimator-keras does not support it (no engine feeds it its input, and "
              "nothing here is tested on it)"),
)


def _status(tf_version):
    missing = keras_setup.no_keras3_message(tf_version, engine="keras3")
    if missing:
        return False, f"not available: {missing}"
    backends = ", ".join(f"{name} {version}"
                         for name, version in keras_setup.usable_backends(BACKENDS))
    backend, _ = keras_setup.keras_backend()
    usable = (backend in (b.name for b in BACKENDS)
              and keras_setup.backend_installed(backend))
    return True, (f"available (Keras {keras_setup.keras3_installed_version()}; backends: "
                  f"{backends}; {keras_setup.BACKEND_VARIABLE}: {backend}"
                  f"{'' if usable else ', which it cannot train on here'})")


def _cluster_check(workers, strategy, environ):
    """Several training processes need the JAX backend."""
    backend, origin = keras_setup.keras_backend(environ)
    asked = workers or (f"--strategy {strategy}" if strategy == "multi_worker_mirrored" else None)
    if asked and backend != MULTI_PROCESS_BACKEND:
        raise ConfigError(
            f"the keras3 engine trains several processes together only on the JAX backend "
            f"(jax.distributed, with keras.distribution.DataParallel), and this is the {backend} "
            f"backend ({origin}): {NO_TF_MULTI_WORKER}. For {asked}, set "
            f"{keras_setup.BACKEND_VARIABLE}=jax (pip install -e '.[jax]'), or train with "
            f"--engine keras; one process can use --strategy mirrored over its own devices.")


def _processes(environ, info):
    """The process group on the JAX backend (None elsewhere: the TensorFlow
    backend trains in one process)."""
    if keras_setup.keras_backend(environ)[0] != MULTI_PROCESS_BACKEND:
        return None
    from estimator_keras.distribute import jax_processes  # pylint: disable=import-outside-toplevel
    return jax_processes.from_environ(environ, info)


def _warning(backend, platform, model, processes=1):
    from estimator_keras.engines.keras3 import advice  # pylint: disable=import-outside-toplevel
    return advice.slow_backend_warning(backend, platform, model, processes)


ENTRY = Entry(
    name="keras3",
    engine="estimator_keras.engines.keras3.engine:Keras3Engine",
    summary="Keras 3's Model.fit on the TensorFlow or JAX backend (KERAS_BACKEND), several "
            "processes together on JAX",
    status=_status,
    keras=3,
    cluster=Cluster(("chief", "worker"), ("none", "mirrored", "multi_worker_mirrored"),
                    "trains with Keras 3's Model.fit, several processes together on the JAX "
                    "backend, and evaluates as it trains", check=_cluster_check),
    keras_backends=BACKENDS,
    refused_backends=REFUSED_BACKENDS,
    auto=3,
    processes=_processes,
    job_kinds=("vertex", "trainjob", "jaxjob", "katib"),
    trainjob_runtime="jax-distributed",
    marker=checkpoints.present,
    newest=checkpoints.find,
    refuse_model_dir=checkpoints.refuse_other_engine,
    continues=("estimator", "keras"),
    no_tf_multi_worker=NO_TF_MULTI_WORKER,
    image_hint=("an image with this package, Keras 3 and JAX installed. Build one from the "
                "repository's Dockerfile with `docker build --build-arg STACK=keras3 "
                "--build-arg PYTHON_VERSION=3.12 -t IMAGE .` (DEVICE=gpu for JAX on GPUs), "
                "push it and pass --container-image IMAGE"),
    warning=_warning,
    packages=(("keras", ("keras",)),),
)
