"""Which Keras this process gets, and whether a model fits the engine.

TensorFlow 2.16+ hands out Keras 2 (the ``tf-keras`` package) as ``tf.keras``
when ``TF_USE_LEGACY_KERAS`` is true when ``tf.keras`` is first touched, and
Keras 3 (the ``keras`` package, on the backend that ``KERAS_BACKEND`` or
``keras.json`` names) otherwise. The estimator and keras engines need Keras 2,
the keras3 engine Keras 3; the same builder (``tf.keras``) serves all three,
so the choice must be made before TensorFlow or Keras is imported. Without
TensorFlow, the ``keras`` package is the builders' Keras (:func:`keras_api`),
and a Keras 3 engine trains on a backend that an input pipeline of its own
feeds (JAX and Grain). Everything here decides from the environment and
package metadata, without importing TensorFlow, Keras or JAX, except where
they are already imported and in :func:`backend_devices` and
:func:`keras_api`, which the engine calls once it runs.
"""

import collections.abc
import importlib.util
import json
import os
import sys

from estimator_keras.engines.registry import installed_version  # noqa: F401  (this module's API)
from estimator_keras.errors import ConfigError

LEGACY_KERAS_VARIABLE = "TF_USE_LEGACY_KERAS"
BACKEND_VARIABLE = "KERAS_BACKEND"
# What TensorFlow's lazy tf.keras loader takes for "use tf-keras".
_TRUE_VALUES = ("true", "True", "1")

# Keras 3's backend where neither KERAS_BACKEND nor keras.json names one;
# Keras 2 computes with TensorFlow too. Which backends an engine trains on,
# and why it refuses others, its registry entry says.
KERAS_DEFAULT_BACKEND = "tensorflow"

# The modules of TensorFlow's stack that a missing install shows up as.
TENSORFLOW_STACK_MODULES = ("tensorflow", "tensorflow_estimator", "tf_keras")

TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu",
                            "tensorflow-intel", "tensorflow-macos")


def version_tuple(version):
    return tuple(int(p) for p in str(version).split(".")[:2] if p.isdigit())


def tensorflow_installed_version():
    return installed_version(*TENSORFLOW_DISTRIBUTIONS)


def tensorflow_installed():
    """Whether ``import tensorflow`` can succeed here (or already has)."""
    return "tensorflow" in sys.modules or importlib.util.find_spec("tensorflow") is not None


def keras_api():
    """The Keras module that model builders, metrics and schedules use:
    ``tf.keras`` where TensorFlow is installed (Keras 2 or Keras 3, as
    :func:`~estimator_keras.engines.prepare_keras` chose), else the
    ``keras`` package, Keras 3, which a Keras 3 engine trains without
    TensorFlow. Imports it."""
    # pylint: disable=import-outside-toplevel
    if not tensorflow_installed():
        import keras
        return keras
    import tensorflow as tf
    return tf.keras


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
    return KERAS_DEFAULT_BACKEND, f"Keras' default ({BACKEND_VARIABLE} is unset)"


def _backend(name):
    """The :class:`~estimator_keras.engines.registry.Backend` of that name
    some engine trains on, or None."""
    from estimator_keras.engines import registry  # pylint: disable=import-outside-toplevel
    return next((entry.backend(name) for entry in registry.entries() if entry.backend(name)),
                None)


def backend_installed(backend):
    """Whether the modules a training backend needs are installed (from
    metadata); False for a backend no engine trains on."""
    spec = _backend(backend)
    return spec is not None and all(importlib.util.find_spec(m) is not None
                                    for m in spec.modules)


def usable_backends(backends):
    """[(backend, version)] of these :class:`~estimator_keras.engines.registry.Backend`
    that are installed here, from metadata."""
    return [(spec.name, installed_version(*(spec.distributions or spec.modules[:1])))
            for spec in backends if backend_installed(spec.name)]


def check_backend(environ=os.environ, engine=None):
    """Raises ConfigError unless Keras 3's backend is one ``engine`` trains
    on (its registry entry's ``keras_backends``; None: any engine with Keras
    3 backends) and it is installed; returns the backend's name. A backend
    the entry refuses is refused with the entry's reason."""
    from estimator_keras.engines import registry  # pylint: disable=import-outside-toplevel
    entries = ([registry.get(engine)] if engine else
               [entry for entry in registry.entries() if entry.keras_backends])
    who = " or ".join(f"the {entry.name} engine" for entry in entries) or "no engine"
    names = []
    for entry in entries:
        names += [name for name in entry.backends if name not in names]
    backend, origin = keras_backend(environ)
    if backend not in names:
        refusals = [entry.refusal(backend) for entry in entries if entry.refusal(backend)]
        if refusals:
            raise ConfigError(
                f"{origin} names Keras 3's {backend} backend, which {who} cannot train on: "
                f"{refusals[0]}. It trains on {' or '.join(names)} only: set "
                f"{BACKEND_VARIABLE} to one of them.")
        raise ConfigError(
            f"{origin} is not a Keras 3 backend {who} can train on; expected one of "
            f"{', '.join(names)} (Keras takes {KERAS_DEFAULT_BACKEND} where {BACKEND_VARIABLE} "
            f"is unset).")
    spec = _backend(backend)
    if not backend_installed(backend):
        missing = [m for m in spec.modules if importlib.util.find_spec(m) is None]
        here = [name for name in names if backend_installed(name)]
        raise ConfigError(
            f"{origin} asks Keras 3 for the {backend} backend, but {' and '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed in this environment "
            f"({sys.executable}). Install with {spec.install}"
            + (f", or set {BACKEND_VARIABLE}={here[0]} (installed here; Keras takes "
               f"{KERAS_DEFAULT_BACKEND} where {BACKEND_VARIABLE} is unset)." if here else "."))
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


def tensorflow_devices():
    """(platform, count) of this process's devices as TensorFlow sees them."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    for platform in ("TPU", "GPU"):
        found = tf.config.list_physical_devices(platform)
        if found:
            return platform.lower(), len(found)
    return "cpu", 1


def backend_devices(engine_name):
    """(backend, platform, count): what ``engine_name`` computes with, and
    this process's devices as that backend sees them ("cpu", "gpu" or
    "tpu"; the entry's backend says how to ask). Imports the backend: call
    it once the engine's Keras is imported (and a process group joined)."""
    # pylint: disable=import-outside-toplevel  (see the module docstring)
    from estimator_keras.engines import registry
    entry = registry.get(engine_name)
    backend = KERAS_DEFAULT_BACKEND
    if entry.keras == 3:
        import keras
        backend = keras.config.backend()
    spec = entry.backend(backend)
    platform, count = (spec.devices if spec is not None and spec.devices
                       else tensorflow_devices)()
    return backend, platform, count


def tf_keras_major(environ=os.environ):
    """The Keras ``tf.keras`` will be here (2 or 3), from metadata alone: 2
    where tf-keras would be tf.keras or Keras 3 cannot run (TensorFlow
    <= 2.15, or no Keras 3), else 3."""
    return 2 if legacy_keras_wanted(environ) or no_keras3_message() else 3


def no_keras3_message(tf_version=None, engine=None):
    """Why a Keras 3 engine (``engine``, or any) cannot run here, from
    metadata; None when it can."""
    who = f"the {engine} engine" if engine else "a Keras 3 engine"
    tf_version = tf_version or tensorflow_installed_version()
    keras_version = installed_version("keras")
    if tf_version is None:
        return _no_keras3_without_tensorflow(who, engine)
    if version_tuple(tf_version) < (2, 16):
        return (f"TensorFlow {tf_version} comes with Keras 2; {who} needs "
                f"TensorFlow 2.16+ and Keras 3 (pip install -e '.[cpu]' on Python 3.12+, '.[keras-cpu]' "
                f"on 3.11)")
    if keras_version is None or version_tuple(keras_version) < (3,):
        found = f"keras {keras_version}" if keras_version else "no keras package"
        return (f"Keras 3 is not installed ({found} beside TensorFlow {tf_version}): pip "
                f"install 'keras>=3.15,<4'")
    return None


_WITH_TENSORFLOW = "pip install -e '.[cpu]' on Python 3.12+ brings TensorFlow 2.21 and Keras 3"


def tensorflow_free_backends(engine=None):
    """[(Backend, pipelines)]: the Keras 3 backends of ``engine``'s registry
    entry (None: of every engine) that an input pipeline feeds without
    TensorFlow, with those pipelines, installed or not."""
    from estimator_keras import pipeline_choice  # pylint: disable=import-outside-toplevel
    from estimator_keras.engines import registry  # pylint: disable=import-outside-toplevel
    entries = [registry.get(engine)] if engine else registry.entries()
    found = []
    for entry in entries:
        for backend in entry.keras_backends:
            pipelines = pipeline_choice.tensorflow_free(backend)
            if pipelines and backend.name not in [b.name for b, _ in found]:
                found.append((backend, pipelines))
    return found


def _no_keras3_without_tensorflow(who, engine):
    """Why a Keras 3 engine cannot train here without TensorFlow; None where
    Keras 3, a backend that a TensorFlow-free pipeline feeds, and that
    pipeline are installed."""
    from estimator_keras import pipeline_choice  # pylint: disable=import-outside-toplevel
    candidates = tensorflow_free_backends(engine)
    has_keras3 = keras3_installed_version() is not None
    for backend, pipelines in candidates:
        if has_keras3 and backend_installed(backend.name) and any(
                pipeline_choice.installed(p) for p in pipelines):
            return None
    if not candidates:
        return (f"TensorFlow is not installed ({who} reads its input with tf.data): "
                f"{_WITH_TENSORFLOW}")
    backend, pipelines = candidates[0]
    missing = ((["Keras 3"] if not has_keras3 else [])
               + [m for m in backend.modules if importlib.util.find_spec(m) is None]
               + [p for p in pipelines if not pipeline_choice.installed(p)])
    return (f"TensorFlow is not installed, and without it {who} trains only on Keras 3's "
            f"{backend.name} backend with the {' or '.join(pipelines)} input pipeline, which "
            f"need{'s' if len(missing) == 1 else ''} {', '.join(missing)} installed too: "
            f"install {'it' if len(missing) == 1 else 'them'} with {backend.install} and set "
            f"{BACKEND_VARIABLE}={backend.name}; or {_WITH_TENSORFLOW}")


def use_keras3(environ=os.environ, engine=None):
    """Makes ``tf.keras`` Keras 3 for a Keras 3 engine (``engine``, for
    messages): an explicit engine
    choice wins over ``TF_USE_LEGACY_KERAS=1`` (which this package sets on
    import where tf-keras is installed). Too late once TensorFlow has handed
    out Keras 2: then ConfigError."""
    if legacy_keras_requested(environ):
        # TensorFlow reads the variable when tf.keras is first touched.
        environ[LEGACY_KERAS_VARIABLE] = "0"
    who = f"the {engine} engine" if engine else "a Keras 3 engine"
    tf = sys.modules.get("tensorflow")
    if tf is None:
        return
    try:
        module = tf.keras.Model.__module__
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{who} needs Keras 3 as tf.keras, but tf.keras does "
                          f"not import (TensorFlow {tf.__version__}): {e}") from e
    if ".engine." in module or not module.startswith("keras."):
        raise ConfigError(
            f"{who} needs Keras 3 as tf.keras, but TensorFlow {tf.__version__} "
            f"was imported and handed out Keras 2 ({module}) before the engine was chosen. "
            f"Call estimator_keras.engines.prepare_keras({engine or 'ENGINE'!r}) before importing "
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
