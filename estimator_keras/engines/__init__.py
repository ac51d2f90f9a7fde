"""The training engines, and which one this environment can run.

- ``estimator``: ``tf.keras.estimator.model_to_estimator`` and
  ``tf.estimator.train_and_evaluate`` (TensorFlow <= 2.15 with
  ``tensorflow-estimator``): :mod:`estimator_keras.engines.estimator`.
- ``keras``: ``Model.fit`` under ``tf.distribute`` strategies (any
  TensorFlow 2.15+; on 2.16+ with Keras 2 from the ``tf-keras`` package):
  :mod:`estimator_keras.engines.keras`.

Both implement :class:`estimator_keras.engines.base.Engine`, read the same
TFRecords through the same input pipeline and write checkpoints with the same
object-based keys (:mod:`estimator_keras.checkpoints`), so exports
and weights move between them. This module decides which engine runs and
imports TensorFlow only inside the functions that must probe it.

Example::

    from estimator_keras import engines
    name = engines.resolve_engine("auto")   # "estimator" on TF 2.15, else "keras"
    engine = engines.get_engine(name)
"""

import importlib
import importlib.metadata
import importlib.util
import os
import sys

from estimator_keras.errors import ConfigError

ENGINES = ("estimator", "keras")
CHOICES = ("auto",) + ENGINES

LEGACY_KERAS_VARIABLE = "TF_USE_LEGACY_KERAS"


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


def _installed(*distributions):
    """The version of the first installed distribution of these names, or None."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def statuses():
    """(engine, available, what this environment offers for it) for each
    engine, from package metadata alone: quick, and TensorFlow is not imported."""
    tf_version = _installed("tensorflow", "tensorflow-cpu", "tensorflow-gpu",
                            "tensorflow-intel", "tensorflow-macos")
    if tf_version is None:
        return [(e, False, "not available: TensorFlow is not installed") for e in ENGINES]
    old_tf = tuple(int(p) for p in tf_version.split(".")[:2] if p.isdigit()) < (2, 16)
    estimator = _installed("tensorflow-estimator")
    tf_keras = _installed("tf-keras")
    if estimator and old_tf:
        est = (True, f"available (TensorFlow {tf_version}, tensorflow-estimator {estimator})")
    else:
        est = (False, f"not available: tf.estimator ended with TensorFlow 2.15 (this is "
                      f"{tf_version})" if not old_tf else "not available: tensorflow-estimator "
                      "is not installed")
    if old_tf:
        keras = (True, f"available (TensorFlow {tf_version}, its own Keras 2)")
    elif tf_keras:
        keras = (True, f"available (TensorFlow {tf_version}, tf-keras {tf_keras})")
    else:
        keras = (False, f"not available: TensorFlow {tf_version} needs tf-keras for Keras 2 "
                        f"(pip install --no-deps "
                        f"'tf-keras~={'.'.join(tf_version.split('.')[:2])}.0')")
    return [("estimator", *est), ("keras", *keras)]


def describe():
    """(engine, what this environment offers for it), as ``list`` shows it."""
    return [(name, text) for name, _, text in statuses()]


def auto_from_metadata():
    """What ``--engine auto`` picks, judged from package metadata alone (for
    launchers that should not load TensorFlow)."""
    available = {name: ok for name, ok, _ in statuses()}
    return "estimator" if available["estimator"] else "keras"


def keras_major_version():
    """2 when ``tf.keras`` is Keras 2 (TF 2.15's own, or tf-keras), else 3."""
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
        return hasattr(tf, "estimator") and hasattr(tf.estimator, "Estimator")
    except Exception:  # pylint: disable=broad-except  (a broken install is "not available")
        return False


def tensorflow_version():
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.__version__


def check_keras2(engine):
    """Raises ConfigError unless ``tf.keras`` is Keras 2, which both engines need."""
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


# What each engine runs of a cluster, known without importing it: launchers
# check a cluster before any task starts, and a task before its strategy
# exists. (TF_CONFIG task types, strategy names, what it does instead.)
CLUSTERS = {
    "estimator": {"tasks": ("chief", "worker", "ps", "evaluator"),
                  "strategies": ("none", "mirrored", "multi_worker_mirrored", "parameter_server"),
                  "how": ""},
    "keras": {"tasks": ("chief", "worker"),
              "strategies": ("none", "mirrored", "multi_worker_mirrored"),
              "how": "trains with Model.fit under MultiWorkerMirroredStrategy and evaluates "
                     "on the chief"},
    "keras3": {"tasks": ("chief",), "strategies": ("none", "mirrored"),
               "how": "trains with Keras 3's Model.fit in one process (over that machine's "
                      "devices) and evaluates there"},
}


def check_cluster(engine, ps=None, evaluator=None, workers=None, strategy=None):
    """Refuses what ``engine`` cannot run: parameter servers, an evaluator
    task, several training tasks, or a strategy; no TensorFlow is imported.

    Args:
      engine: a resolved engine name.
      ps, evaluator, workers: how the caller asked for them ("--ps 1", "ps
        tasks in TF_CONFIG"...), or None when it did not.
      strategy: a strategy name ("auto" passes), or None.

    Raises:
      ConfigError: naming what was asked and the engine that can run it.
    """
    spec = CLUSTERS.get(engine)
    if spec is None:
        return
    asked = [a for a, task in ((workers, "worker"), (ps, "ps"), (evaluator, "evaluator"))
             if a and task not in spec["tasks"]]
    if asked:
        asked = " and ".join(asked)
        runs_no = [text for task, text in (("worker", "other training tasks"),
                                           ("ps", "parameter servers"),
                                           ("evaluator", "evaluator task"))
                   if task not in spec["tasks"]]
        others = [name for name, other in CLUSTERS.items() if name != engine and all(
            task in other["tasks"] for task, a in (("worker", workers), ("ps", ps),
                                                   ("evaluator", evaluator)) if a)]
        raise ConfigError(
            f"the {engine} engine {spec['how']}: it runs no "
            f"{' and no '.join([', no '.join(runs_no[:-1]), runs_no[-1]] if len(runs_no) > 1 else runs_no)}"
            f", so {asked} cannot be used with it. Drop {asked}"
            + (f", or use --engine {others[0]}{_WHERE.get(others[0], '')}." if others else "."))
    if strategy and strategy != "auto" and strategy not in spec["strategies"]:
        raise ConfigError(
            f"the {engine} engine {spec['how']}: it cannot train with --strategy {strategy}; "
            f"use one of {', '.join(('auto',) + spec['strategies'])}.")


# Where an engine runs, for the messages that suggest it.
_WHERE = {"estimator": " (TensorFlow 2.15)"}


def check_keras_cluster(ps=None, evaluator=None):
    """:func:`check_cluster` for the keras engine."""
    check_cluster("keras", ps=ps, evaluator=evaluator)


def resolve_engine(requested="auto"):
    """The engine to train with: ``requested``, or for "auto" (or None)
    ``estimator`` where ``tensorflow_estimator`` imports, else ``keras``.

    Raises:
      ConfigError: an unknown name, the estimator engine where the Estimator
        does not exist, or no Keras 2.
    """
    requested = requested or "auto"
    if requested not in CHOICES:
        raise ConfigError(f"unknown engine {requested!r}; expected one of {', '.join(CHOICES)}.")
    available = estimator_available()
    if requested == "auto":
        requested = "estimator" if available else "keras"
    if requested == "estimator" and not available:
        raise ConfigError(
            f"the estimator engine needs tf.estimator, which ended with TensorFlow 2.15 and "
            f"tensorflow-estimator 2.15 (this is TensorFlow {tensorflow_version()}"
            f"{'' if importlib.util.find_spec('tensorflow_estimator') else ', without tensorflow-estimator'}"
            f"). Use --engine keras (Model.fit) here, or install tensorflow-cpu==2.15.* and "
            f"tensorflow-estimator==2.15.* on Python <= 3.11.")
    check_keras2(requested)
    return requested


def get_engine(name):
    """The :class:`~estimator_keras.engines.base.Engine` for a resolved name
    ("estimator" or "keras"); imports that engine's module, and TensorFlow."""
    if name not in ENGINES:
        raise ConfigError(f"unknown engine {name!r}; expected one of {', '.join(ENGINES)}.")
    module = importlib.import_module(f"estimator_keras.engines.{name}")
    return module.EstimatorEngine() if name == "estimator" else module.KerasEngine()
