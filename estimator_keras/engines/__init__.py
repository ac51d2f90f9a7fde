"""The training engines, and which one this environment can run.

- ``estimator``: ``tf.keras.estimator.model_to_estimator`` and
  ``tf.estimator.train_and_evaluate`` (TensorFlow <= 2.15 with
  ``tensorflow-estimator``): the package :mod:`estimator_keras.engines.estimator`.
- ``keras``: ``Model.fit`` of Keras 2 under ``tf.distribute`` strategies (any
  TensorFlow 2.15+; on 2.16+ with Keras 2 from the ``tf-keras`` package):
  :mod:`estimator_keras.engines.keras`.
- ``keras3``: ``Model.fit`` of Keras 3 (TensorFlow 2.16+), on the backend that
  ``KERAS_BACKEND`` names (tensorflow or jax; without TensorFlow, jax with
  the Grain input pipeline): :mod:`estimator_keras.engines.keras3`.

Each is one package holding all that is its own, and one
:class:`~estimator_keras.engines.registry.Entry` (in the package's
``__init__``) that says what the rest of the program asks about it. Each
implements :class:`estimator_keras.engines.base.Engine` and reads the same
TFRecords through the same input pipeline. This module decides which engine
runs and imports TensorFlow only inside the functions that must probe it;
:func:`prepare_keras` makes ``tf.keras`` the Keras the engine needs and must
run before TensorFlow is imported.

Example::

    from estimator_keras import engines
    engines.prepare_keras("auto")           # before `import tensorflow`
    name = engines.resolve_engine("auto")   # "estimator" on TF 2.15, else keras or keras3
    engine = engines.get_engine(name)
"""

import importlib
import importlib.util
import os
import sys

from estimator_keras.engines.keras_setup import (  # noqa: F401  (this module's API)
    BACKEND_VARIABLE, LEGACY_KERAS_VARIABLE, backend_devices, check_backend, check_model_keras,
    keras_api, keras_backend, prefer_legacy_keras)
from estimator_keras.engines import keras_setup, registry
from estimator_keras.errors import ConfigError

AUTO = registry.AUTO


def __getattr__(name):
    # AUTO_RULE: --engine auto's order in words, from the registry when asked
    # (an engine registered later is in it).
    if name == "AUTO_RULE":
        return registry.auto_rule()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def names():
    """Every registered engine's name."""
    return registry.names()


def choices():
    """``--engine``'s choices: "auto" and every engine."""
    return registry.choices()


def statuses():
    """(engine, available, what this environment offers for it) for each
    engine, from package metadata alone: quick, and TensorFlow is not imported.
    Without TensorFlow, only an engine with a Keras 3 backend that an input
    pipeline feeds without it may run: its entry's status is asked with None."""
    tf_version = keras_setup.tensorflow_installed_version()
    if tf_version is None:
        return [(entry.name, *entry.status(None))
                if keras_setup.tensorflow_free_backends(entry.name) else
                (entry.name, False, "not available: TensorFlow is not installed")
                for entry in registry.entries()]
    return [(entry.name, *entry.status(tf_version)) for entry in registry.entries()]


def describe():
    """(engine, what this environment offers for it), as ``list`` shows it."""
    return [(name, text) for name, _, text in statuses()]


def _auto_pick(keras, runs):
    """The first engine of auto's order that trains ``keras`` (2 or 3) and
    ``runs(entry)``; else the last of that Keras in auto's order (whose
    refusal then says what is missing)."""
    order = registry.auto_order()
    fits = [entry for entry in order if entry.keras == keras] or order
    return next((entry for entry in fits if runs(entry)), fits[-1]).name


def auto_from_metadata(environ=os.environ, model_dir=None):
    """What ``--engine auto`` picks, judged from package metadata alone (for
    launchers that should not load TensorFlow): the first engine of the
    registry's auto order (see :func:`estimator_keras.engines.registry.auto_rule`)
    that is available and trains the Keras ``tf.keras`` will be. A model dir
    an engine wrote with its own files stays on that engine where it can run."""
    available = {name: ok for name, ok, _ in statuses()}
    from estimator_keras.engines import model_dirs  # pylint: disable=import-outside-toplevel
    marked = model_dirs.marked_by(model_dir)
    if marked is not None and available.get(marked):
        return marked
    return _auto_pick(keras_setup.tf_keras_major(environ),
                      lambda entry: available.get(entry.name))


def prepare_keras(engine_name="auto", environ=os.environ, model_dir=None):
    """Makes ``tf.keras`` the Keras that ``engine_name`` needs; call it before
    TensorFlow is imported. Returns the engine it prepared for ("auto" is
    decided by :func:`auto_from_metadata`).

    keras3: Keras 3 must be installed and ``KERAS_BACKEND`` (or keras.json)
    must name an installed backend it can train on; ``TF_USE_LEGACY_KERAS``
    is set to "0" so that tf.keras is Keras 3 even where tf-keras is installed.
    estimator and keras: as on import of this package, ``TF_USE_LEGACY_KERAS=1``
    where tf-keras is installed and the variable unset.

    Raises:
      ConfigError: an unknown engine; keras3 without Keras 3, with an unknown
        or missing backend, or after TensorFlow handed out Keras 2.
    """
    name = engine_name or AUTO
    if name not in choices():
        raise ConfigError(f"unknown engine {name!r}; expected one of {', '.join(choices())}.")
    if name == AUTO:
        name = auto_from_metadata(environ, model_dir)
    if registry.get(name).keras == 3:
        check_keras3_installed(name)
        keras_setup.check_backend(environ, name)
        keras_setup.use_keras3(environ, name)
    else:
        keras_setup.prefer_legacy_keras(environ)
    return name


def check_keras3_installed(engine):
    """Raises ConfigError when a Keras 3 engine cannot run here (from metadata)."""
    missing = keras_setup.no_keras3_message(engine=engine)
    if missing:
        raise ConfigError(f"--engine {engine} trains with Keras 3, which this environment "
                          f"cannot run: {missing}. The estimator and keras engines need no "
                          f"Keras 3 (`python -m experiments list` shows what runs here).")


def keras_major_version():
    """2 when ``tf.keras`` is Keras 2 (TF 2.15's own, or tf-keras), else 3;
    without TensorFlow, 3 where Keras 3 is installed (the builders' Keras,
    see :func:`~estimator_keras.engines.keras_setup.keras_api`), else None."""
    if not keras_setup.tensorflow_installed():
        return 3 if keras_setup.keras3_installed_version() else None
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    try:
        module = tf.keras.Model.__module__
    except (ImportError, AttributeError):
        return None
    # Keras 2 keeps Model in ".engine.training"; Keras 3 in ".models.model".
    return 2 if ".engine." in module else 3


def estimator_available():
    """True when ``tf.estimator`` really imports (it ends at TensorFlow 2.15)."""
    if importlib.util.find_spec("tensorflow_estimator") is None:
        return False
    try:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        return isinstance(tf.estimator.Estimator, type)
    except Exception:  # pylint: disable=broad-except  (a broken install is "not available")
        return False


def tensorflow_version():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.__version__


def check_keras2(engine):
    """Raises ConfigError unless ``tf.keras`` is Keras 2, which both engines need."""
    check_tensorflow(engine)
    major = keras_major_version()
    if major == 2:
        return
    version = tensorflow_version()
    if major is None:
        found = "tf.keras does not import"
    else:
        found = "tf.keras is Keras 3"
    raise ConfigError(
        f"the {engine} engine needs Keras 2 as tf.keras, but {found} (TensorFlow "
        f"{version}, {LEGACY_KERAS_VARIABLE}={os.environ.get(LEGACY_KERAS_VARIABLE, '(unset)')}). "
        f"On TensorFlow 2.16+ install Keras 2 beside TensorFlow with `pip install --no-deps "
        f"'tf-keras~={'.'.join(version.split('.')[:2])}.0'` and set {LEGACY_KERAS_VARIABLE}=1 "
        f"before TensorFlow is imported (importing estimator_keras before tensorflow sets it "
        f"when tf-keras is installed).")


def check_tensorflow(engine):
    """Raises ConfigError where TensorFlow, which a Keras 2 engine trains
    with, is not installed."""
    if not keras_setup.tensorflow_installed():
        raise ConfigError(f"the {engine} engine trains Keras 2 models with TensorFlow, which is "
                          f"not installed here ({sys.executable}). "
                          f"{_engines_here()}, or install TensorFlow with this package's "
                          f"extras (`pip install -e '.[cpu]'`).")


def check_cluster(engine, ps=None, evaluator=None, workers=None, strategy=None,
                  environ=os.environ):
    """Refuses what ``engine`` (a resolved name; an unknown one passes)
    cannot run: its entry's
    :meth:`~estimator_keras.engines.registry.Entry.check_cluster`, for
    launchers that check a cluster before any task starts."""
    entry = registry.find(engine)
    if entry is not None:
        entry.check_cluster(ps=ps, evaluator=evaluator, workers=workers, strategy=strategy,
                            environ=environ)


def cluster_info(engine, environ=os.environ):
    """(this task's ClusterInfo, its process group or None) for ``engine``:
    its entry's :meth:`~estimator_keras.engines.registry.Entry.cluster_info`
    (TF_CONFIG's cluster alone for an unknown engine)."""
    entry = registry.find(engine)
    if entry is None:
        from estimator_keras.distribute import tf_config  # pylint: disable=import-outside-toplevel
        return tf_config.parse_tf_config(env=environ), None
    return entry.cluster_info(environ)


def check_keras3(engine):
    """Raises ConfigError unless a Keras 3 engine can run in this process:
    Keras 3 installed and as tf.keras, on a backend it can train on."""
    check_keras3_installed(engine)
    keras_setup.check_backend(os.environ, engine)
    keras_setup.use_keras3(os.environ, engine)
    if keras_major_version() != 3:
        raise ConfigError(
            f"the {engine} engine needs Keras 3 as tf.keras, but tf.keras does not import "
            f"(TensorFlow {tensorflow_version()}).")


def auto_for_model_dir(model_dir):
    """What ``--engine auto`` continues ``model_dir`` with, once
    :func:`prepare_keras` has chosen tf.keras: the engine that wrote its
    newest checkpoint where that engine runs in this process (installed, and
    its Keras is tf.keras), else "auto". So a keras3 model dir stays on
    keras3, and a TF checkpoint whose engine cannot run here goes to the
    engine "auto" picks (keras3 where tf.keras is Keras 3: it continues the
    checkpoint by structure). Imports TensorFlow."""
    if not model_dir:
        return "auto"
    runnable = {name for name, ok, _ in statuses() if ok}
    major = keras_major_version()
    from estimator_keras.engines import model_dirs  # pylint: disable=import-outside-toplevel
    writer = model_dirs.engine_of(model_dir)
    if writer in runnable and registry.get(writer).keras == major:
        return writer
    return AUTO


def resolve_engine(requested="auto", model_dir=None):
    """The engine to train with: ``requested``, or for "auto" (or None) the
    engine that wrote ``model_dir``'s checkpoint where it runs here (see
    :func:`auto_for_model_dir`), else the first engine of the registry's
    auto order that trains the Keras ``tf.keras`` is and runs in this
    process (its entry's ``cannot_run``).

    Raises:
      ConfigError: an unknown name, an engine whose entry says it cannot run
        here (the estimator engine without tf.estimator), no Keras 2 for a
        Keras 2 engine, no usable Keras 3 for a Keras 3 engine.
    """
    requested = requested or AUTO
    if requested not in choices():
        raise ConfigError(f"unknown engine {requested!r}; expected one of {', '.join(choices())}.")
    if requested == AUTO and model_dir:
        requested = auto_for_model_dir(model_dir)
    if requested == AUTO:
        requested = _auto_pick(keras_major_version() or 2,
                               lambda entry: not _cannot_run(entry))
    entry = registry.get(requested)
    if entry.keras == 3:
        check_keras3(requested)
    else:
        check_tensorflow(requested)
    why = _cannot_run(entry)
    if why:
        raise ConfigError(f"{why} {_engines_here()}.")
    if entry.keras != 3:
        check_keras2(requested)
    return requested


def _cannot_run(entry):
    return entry.cannot_run() if entry.cannot_run is not None else ""


def _engines_here():
    """"Use --engine keras3 here" for the engines this environment can run."""
    here = [f"--engine {name}" for name, ok, _ in statuses() if ok]
    if not here:
        return "No engine runs in this environment (`python -m experiments list` says why)"
    return f"Use {' or '.join(here)} here"


def get_engine(name):
    """The :class:`~estimator_keras.engines.base.Engine` for a resolved name
    (its registry entry's ``engine``); imports that engine's module, and
    TensorFlow."""
    module, cls = registry.get(name).engine.split(":")
    return getattr(importlib.import_module(module), cls)()


def setup_warning(engine, backend, platform, model, processes=1):
    """The engine's warning for a setup known to be much slower for
    ``model`` (its registry entry's ``warning``), or None."""
    entry = registry.get(engine)
    return entry.warning(backend, platform, model, processes) if entry.warning else None
