"""Which Keras this process gets, and whether a model fits the engine.

TensorFlow 2.16+ hands out Keras 2 (the ``tf-keras`` package) as ``tf.keras``
when ``TF_USE_LEGACY_KERAS`` is true when ``tf.keras`` is first touched, and
Keras 3 (the ``keras`` package, on the backend that ``KERAS_BACKEND`` or
``keras.json`` names) otherwise. The estimator and keras engines need Keras 2,
the keras3 engine Keras 3; the same builder (``tf.keras``) serves all three,
so the choice must be made before TensorFlow or Keras is imported. Everything
here decides from the environment and package metadata, without importing
TensorFlow, Keras or JAX, except where they are already imported and in
:func:`backend_devices`, which asks the backend once the engine runs.
"""

import collections.abc
import importlib.metadata
import importlib.util
import json
import os
import sys

from estimator_keras.errors import ConfigError

LEGACY_KERAS_VARIABLE = "TF_USE_LEGACY_KERAS"
BACKEND_VARIABLE = "KERAS_BACKEND"
# What TensorFlow's lazy tf.keras loader takes for "use tf-keras".
_TRUE_VALUES = ("true", "True", "1")

# The Keras 3 backends the keras3 engine trains on: the modules that must be
# importable, and how to install them (the package is installed from its
# checkout, not from an index).
TRAINING_BACKENDS = {
    "tensorflow": (("tensorflow",), "`pip install -e '.[cpu]'` (or '.[gpu]') in the folder of "
                                    "your estimator-keras checkout"),
    "jax": (("jax", "jaxlib"), "`pip install -e '.[jax]'` in the folder of your estimator-keras "
                               "checkout"),
}
# Keras 3 backends that run inference only: Model.fit does not exist there.
INFERENCE_BACKENDS = ("numpy", "openvino")
# Keras 3 backends that train, but not with this package: no engine feeds
# them, and nothing here is tested on them.
UNSUPPORTED_BACKENDS = ("torch",)

# The modules of TensorFlow's stack that a missing install shows up as.
TENSORFLOW_STACK = ("tensorflow", "tensorflow_estimator", "tf_keras")

TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu",
                            "tensorflow-intel", "tensorflow-macos")


def installed_version(*distributions):
    """The version of the first installed distribution of these names, or None."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def version_tuple(version):
    return tuple(int(p) for p in str(version).split(".")[:2] if p.isdigit())


def tensorflow_installed_version():
    return installed_version(*TENSORFLOW_DISTRIBUTIONS)


def keras3_installed_version():
    """The installed ``keras`` distribution's version when it is Keras 3, else None."""
    version = installed_version("keras")
    return version if version and version_tuple(version) >= (3,) else None


def legacy_keras_requested(environ=os.environ):
    """True when ``TF_USE_LEGACY_KERAS`` asks TensorFlow for tf-keras."""
    return environ.get(LEGACY_KERAS_VARIABLE) in _TRUE_VALUES


def legacy_keras_wanted(environ=os.environ):
    """Whether tf-keras would be ``tf.keras`` here: installed, and the
    variable true or unset (then :func:`prefer_legacy_keras` sets it)."""
    if importlib.util.find_spec("tf_keras") is None:
        return False
    return LEGACY_KERAS_VARIABLE not in environ or legacy_keras_requested(environ)


def prefer_legacy_keras(environ=os.environ):
    """Asks TensorFlow 2.16+ for Keras 2 (``tf-keras``) as ``tf.keras``.

    Sets ``TF_USE_LEGACY_KERAS=1`` unless the user set it, TensorFlow is
    already imported (too late to matter) or ``tf_keras`` is not installed
    (TensorFlow 2.15 then fails to import ``tf.keras`` at all). Returns
    whether the variable is now "1".
    """
    if LEGACY_KERAS_VARIABLE not in environ and "tensorflow" not in sys.modules:
        if importlib.util.find_spec("tf_keras") is not None:
            environ[LEGACY_KERAS_VARIABLE] = "1"
    return environ.get(LEGACY_KERAS_VARIABLE) == "1"


def keras_config_path(environ=os.environ):
    """Where Keras 3 reads its ``keras.json`` (``KERAS_HOME``, else ~/.keras,
    or /tmp/.keras where the home directory is not writable)."""
    if "KERAS_HOME" in environ:
        home = environ["KERAS_HOME"]
    else:
        base = os.path.expanduser("~")
        home = os.path.join(base if os.access(base, os.W_OK) else "/tmp", ".keras")
    return os.path.join(os.path.expanduser(home), "keras.json")


def keras_backend(environ=os.environ):
    """(backend, where it was chosen) as Keras 3 will pick it on import: a
    non-empty ``KERAS_BACKEND``, else ``keras.json``'s "backend", else tensorflow."""
    if environ.get(BACKEND_VARIABLE):
        return environ[BACKEND_VARIABLE], f"{BACKEND_VARIABLE}={environ[BACKEND_VARIABLE]}"
    path = keras_config_path(environ)
    try:
        with open(path, encoding="utf-8") as f:
            backend = json.load(f).get("backend")
    except (OSError, ValueError, AttributeError):
        backend = None
    if backend:
        return backend, f"the backend {backend!r} in {path} ({BACKEND_VARIABLE} is unset)"
    return "tensorflow", f"Keras' default ({BACKEND_VARIABLE} is unset)"


def backend_installed(backend):
    modules, _ = TRAINING_BACKENDS[backend]
    return all(importlib.util.find_spec(m) is not None for m in modules)


def usable_backends():
    """[(backend, version)] of the training backends installed here, from metadata."""
    found = []
    for backend, (modules, _) in TRAINING_BACKENDS.items():
        if backend_installed(backend):
            version = (tensorflow_installed_version() if backend == "tensorflow"
                       else installed_version(modules[0]))
            found.append((backend, version))
    return found


def check_backend(environ=os.environ):
    """Raises ConfigError unless Keras 3's backend is one the keras3 engine
    can train on and it is installed; returns the backend's name."""
    backend, origin = keras_backend(environ)
    if backend in INFERENCE_BACKENDS:
        raise ConfigError(
            f"{origin} names a Keras 3 backend that only runs inference ({backend} has no "
            f"Model.fit), so the keras3 engine cannot train on it. Set {BACKEND_VARIABLE} to "
            f"one of {', '.join(TRAINING_BACKENDS)}.")
    if backend in UNSUPPORTED_BACKENDS:
        raise ConfigError(
            f"{origin} names Keras 3's {backend} backend, which estimator-keras does not "
            f"support: the keras3 engine trains on {' or '.join(TRAINING_BACKENDS)} only. Set "
            f"{BACKEND_VARIABLE}=tensorflow (the default) or {BACKEND_VARIABLE}=jax.")
    if backend not in TRAINING_BACKENDS:
        raise ConfigError(
            f"{origin} is not a Keras 3 backend the keras3 engine can train on; expected one "
            f"of {', '.join(TRAINING_BACKENDS)} (tensorflow where {BACKEND_VARIABLE} is unset).")
    if not backend_installed(backend):
        missing = [m for m in TRAINING_BACKENDS[backend][0]
                   if importlib.util.find_spec(m) is None]
        raise ConfigError(
            f"{origin} asks Keras 3 for the {backend} backend, but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed in this environment "
            f"({sys.executable}). Install with {TRAINING_BACKENDS[backend][1]}, or unset "
            f"{BACKEND_VARIABLE} to train on the TensorFlow backend.")
    keras = sys.modules.get("keras")
    version = getattr(keras, "__version__", "") if keras is not None else ""
    if version_tuple(version) >= (3,):
        # Keras fixes its backend on import; the variable can no longer change it.
        loaded = keras.config.backend()
        if loaded != backend:
            raise ConfigError(
                f"Keras 3 was already imported on the {loaded} backend when {origin} asked "
                f"for {backend}: {BACKEND_VARIABLE} must be set before keras (or tf.keras) "
                f"is first imported.")
    return backend


def backend_devices(engine_name):
    """(backend, platform, count): what ``engine_name`` computes with, and
    this process's devices as that backend sees them ("cpu", "gpu" or
    "tpu"). Imports the backend: call it once the engine's Keras is
    imported (and a JAX process group joined)."""
    # pylint: disable=import-outside-toplevel  (see the module docstring)
    from estimator_keras.engines import registry
    backend = "tensorflow"
    if registry.get(engine_name).keras == 3:
        import keras
        backend = keras.config.backend()
    if backend == "jax":
        import jax
        devices = jax.local_devices()
        return backend, devices[0].platform, len(devices)
    import tensorflow as tf
    for platform in ("TPU", "GPU"):
        found = tf.config.list_physical_devices(platform)
        if found:
            return backend, platform.lower(), len(found)
    return backend, "cpu", 1


def no_keras3_message(tf_version=None, engine="keras3"):
    """Why the keras3 engine cannot run here, from metadata; None when it can."""
    tf_version = tf_version or tensorflow_installed_version()
    keras_version = installed_version("keras")
    if tf_version is None:
        return ("TensorFlow is not installed (the keras3 engine reads its input with "
                "tf.data): pip install -e '.[cpu]' on Python 3.12+ brings TensorFlow 2.21 "
                "and Keras 3")
    if version_tuple(tf_version) < (2, 16):
        return (f"TensorFlow {tf_version} comes with Keras 2; the {engine} engine needs "
                f"TensorFlow 2.16+ and Keras 3 (pip install -e '.[cpu]' on Python 3.12+, '.[keras-cpu]' "
                f"on 3.11)")
    if keras_version is None or version_tuple(keras_version) < (3,):
        found = f"keras {keras_version}" if keras_version else "no keras package"
        return (f"Keras 3 is not installed ({found} beside TensorFlow {tf_version}): pip "
                f"install 'keras>=3.15,<4'")
    return None


def use_keras3(environ=os.environ):
    """Makes ``tf.keras`` Keras 3 for the keras3 engine: an explicit engine
    choice wins over ``TF_USE_LEGACY_KERAS=1`` (which this package sets on
    import where tf-keras is installed). Too late once TensorFlow has handed
    out Keras 2: then ConfigError."""
    if legacy_keras_requested(environ):
        # TensorFlow reads the variable when tf.keras is first touched.
        environ[LEGACY_KERAS_VARIABLE] = "0"
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return
    try:
        module = tf.keras.Model.__module__
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"the keras3 engine needs Keras 3 as tf.keras, but tf.keras does "
                          f"not import (TensorFlow {tf.__version__}): {e}") from e
    if ".engine." in module or not module.startswith("keras."):
        raise ConfigError(
            f"the keras3 engine needs Keras 3 as tf.keras, but TensorFlow {tf.__version__} "
            f"was imported and handed out Keras 2 ({module}) before the engine was chosen. "
            f"Call estimator_keras.engines.prepare_keras('keras3') before importing "
            f"tensorflow, or set {LEGACY_KERAS_VARIABLE}=0 in the environment.")


def _is_layer(cls):
    """True for a Keras layer class (models are layers) of any Keras."""
    return any(c.__name__ == "Layer" and c.__module__.split(".")[0] in ("keras", "tf_keras")
               for c in cls.__mro__)


def _keras_class(obj):
    """(2 or 3, the Keras class ``obj`` derives from) or (None, None): judged
    by the modules of its class and the classes it derives from (Keras 2 is
    tf-keras, or the ``keras`` 2.x package of TensorFlow <= 2.15)."""
    for cls in type(obj).__mro__:
        module = cls.__module__ or ""
        top = module.split(".")[0]
        if top == "tf_keras" or (top == "tensorflow" and ".keras." in module):
            return 2, cls
        if top == "keras":
            version = getattr(sys.modules.get("keras"), "__version__", "")
            return (3 if version_tuple(version) >= (3,) else 2), cls
    return None, None


def _parts(obj, seen):
    """The layers inside ``obj``: its ``layers`` and layers held in its
    public attributes, lists and dicts (where a subclassed model keeps a
    layer that its own Keras does not track), recursively."""
    candidates = list(getattr(obj, "layers", None) or [])
    try:
        attributes = vars(obj)
    except TypeError:
        attributes = {}
    for name, value in attributes.items():
        if name.startswith("_") or isinstance(value, (str, bytes)):
            continue
        if isinstance(value, collections.abc.Mapping):
            candidates.extend(value.values())
        elif isinstance(value, collections.abc.Sequence):
            candidates.extend(value)
        else:
            candidates.append(value)
    for part in candidates:
        if id(part) in seen or not _is_layer(type(part)):
            continue
        seen.add(id(part))
        yield part
        yield from _parts(part, seen)


def _class_name(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def check_model_keras(model, engine_name, source="the model builder"):
    """Raises ConfigError when ``model`` is not the Keras the engine trains:
    Keras 3 for keras3, Keras 2 for estimator and keras, and never a mix.

    Args:
      model: what the builder returned.
      engine_name: a registered engine (its entry says which Keras it trains).
      source: what built it, for the message ("experiment fashion_mnist_cnn's builder").
    """
    found = {}
    for part in [model] + list(_parts(model, {id(model)})):
        generation, cls = _keras_class(part)
        if generation is not None:
            found.setdefault(generation, _class_name(cls))
    from estimator_keras.engines import registry  # pylint: disable=import-outside-toplevel
    wanted = registry.get(engine_name).keras
    how = ("builders use tf.keras, which is Keras 3 for the keras3 engine and Keras 2 "
           "(tf-keras, TF_USE_LEGACY_KERAS=1) for the estimator and keras engines; import "
           "layers from tf.keras rather than from keras or tf_keras directly")
    if len(found) > 1:
        raise ConfigError(
            f"{source} returned a model that mixes Keras 2 and Keras 3 objects ({found[2]} is "
            f"Keras 2, {found[3]} is Keras 3); one model must be built with one Keras: {how}.")
    if not found:
        raise ConfigError(f"{source} returned {_class_name(type(model))}, which is not a Keras "
                          f"model; it must return an uncompiled tf.keras model.")
    generation, example = next(iter(found.items()))
    if generation != wanted:
        raise ConfigError(
            f"the {engine_name} engine trains Keras {wanted} models, but {source} returned a "
            f"Keras {generation} model ({example}): {how}.")
