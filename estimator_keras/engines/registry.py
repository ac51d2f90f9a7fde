"""The engine registry: one :class:`Entry` per engine says everything the
rest of the program asks about it (what it needs installed, which Keras and
backends, which clusters, strategies and cloud jobs run it, which image a
cloud job takes, how its checkpoints are told apart, and where its Engine
lives). An entry answers which strategy a task trains with
(:meth:`Entry.choose_strategy`) and which versions a tracked run records
(:meth:`Entry.installed_versions`), so that a run resolves its engine and
strategy from the entry in one pass.

The entries are the one source: ``--engine auto``'s order (:func:`auto_order`),
the Keras backends each engine trains on and those it refuses with the
reason (read by :func:`estimator_keras.engines.keras_setup.check_backend`),
and which engine wrote a checkpoint are fields here, never an engine's or a
backend's name in the modules that ask (``tests/test_engine_house.py``).

Entries import nothing heavy: each engine's package ``__init__`` defines its
entry from package metadata and the environment alone, so ``list``,
``submit --dry-run`` and every launcher ask the registry without importing
TensorFlow, Keras or JAX. :func:`get` and :func:`names` see an engine
registered later (:func:`register`) exactly as a built-in one.

Example::

    from estimator_keras.engines import registry
    for entry in registry.entries():
        print(entry.name, entry.job_kinds)
"""

import dataclasses
import importlib
import importlib.metadata
import os
from typing import Callable, Dict, Optional, Tuple

from estimator_keras.errors import ConfigError

# The built-in engines' packages, in the order ``list`` shows them and TF
# checkpoints are attributed (the first entry whose detector claims one).
BUILT_IN = ("estimator_keras.engines.estimator", "estimator_keras.engines.keras",
            "estimator_keras.engines.keras3")
AUTO = "auto"
TENSORFLOW_RUNTIME = "estimator-keras-tensorflow"
"""This package's ClusterTrainingRuntime for TensorFlow clusters (TF_CONFIG) on
Kubeflow Trainer v2, which has none of its own."""


def installed_version(*distributions):
    """The version of the first installed distribution of these names, or None."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What an engine runs of a cluster, known without importing it:
    launchers check a cluster before any task starts, and a task before its
    strategy exists."""

    tasks: Tuple[str, ...]
    """TF_CONFIG task types it runs ("chief", "worker", "ps", "evaluator")."""
    strategies: Tuple[str, ...]
    """``--strategy`` values it trains with ("auto" always passes)."""
    how: str = ""
    """What it does instead of what it refuses, for refusals ("trains with ...")."""
    where: str = ""
    """Where it runs, for messages that suggest it (" (TensorFlow 2.15)")."""
    check: Optional[Callable] = None
    """``fn(workers, strategy, environ)`` refusing what only the environment
    decides (the keras3 engine's backend), or None."""


@dataclasses.dataclass(frozen=True)
class Backend:
    """A Keras 3 backend an engine trains on."""

    name: str
    """``KERAS_BACKEND``'s value."""
    modules: Tuple[str, ...]
    """The modules that must be importable for it."""
    install: str
    """How to install them (a command, for messages)."""
    distributions: Tuple[str, ...] = ()
    """The distributions whose installed version ``list`` shows (the first
    installed); empty: the first module's."""
    multi_process: bool = False
    """Several processes train together on it."""
    devices: Optional[Callable[[], Tuple[str, int]]] = None
    """``fn() -> (platform, count)``: this process's devices as the backend
    sees them ("cpu", "gpu" or "tpu"); None: TensorFlow's."""
    pipelines: Tuple[str, ...] = ("tfdata",)
    """The input pipelines that feed it ("tfdata", "grain"; see
    :mod:`estimator_keras.pipeline_choice`)."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One engine, as every module outside its folder sees it."""

    name: str
    """``--engine NAME``."""
    engine: str
    """``"package.module:Class"`` of its :class:`~estimator_keras.engines.base.Engine`;
    imported by :func:`estimator_keras.engines.get_engine` only (with TensorFlow)."""
    summary: str
    """One line for the docs' engine table: what it trains with."""
    status: Callable[[str], Tuple[bool, str]]
    """``fn(tensorflow_version) -> (available, text)``, from package metadata
    alone; ``list`` shows the text. Where TensorFlow is not installed, it is
    asked with None, and only of an entry with a Keras 3 backend that an
    input pipeline feeds without TensorFlow (the others are not available)."""
    keras: int
    """The Keras major version it needs as ``tf.keras`` (2 or 3)."""
    cluster: Cluster
    """The tasks and strategies it runs."""
    keras_backends: Tuple[Backend, ...] = ()
    """Keras 3 backends it trains on (``KERAS_BACKEND``), the first a cloud
    job's default; empty: it trains on TensorFlow's own ``tf.keras``."""
    refused_backends: Tuple[Tuple[str, str], ...] = ()
    """(backend, why it does not train there) for the Keras 3 backends it
    refuses by name; any other backend outside :attr:`keras_backends` is
    refused as unknown."""
    auto: float = 0
    """Its place in ``--engine auto``'s order (lowest first; 0: auto picks it
    only for a model dir it wrote). Auto takes the first that runs here on
    the Keras ``tf.keras`` is (or will be)."""
    auto_when: str = ""
    """When auto picks it, in words ("where available"), for ``list``."""
    cannot_run: Optional[Callable[[], str]] = None
    """``fn() -> str``: once ``tf.keras`` is its Keras (TensorFlow imported),
    why it cannot train in this process ("" where it can), or None where its
    Keras is all it needs."""
    processes: Optional[Callable] = None
    """``fn(environ, cluster_info)``: the process group it trains with outside
    TensorFlow's runtime (a :class:`~estimator_keras.distribute.groups.ProcessGroup`
    source), or None where it has none."""
    job_kinds: Tuple[str, ...] = ()
    """Cloud jobs that run it: "vertex", "trainjob", "tfjob", "jaxjob", "katib" (a trial:
    one pod)."""
    trainjob_runtime: str = ""
    """The Kubeflow Trainer v2 ClusterTrainingRuntime its TrainJobs name:
    "jax-distributed" (Trainer's own), or this package's TensorFlow runtime
    (:data:`TENSORFLOW_RUNTIME`, ``submit --target trainjob --print-runtime``)."""
    prebuilt_image: Optional[str] = None
    """TensorFlow version of the Google prebuilt Vertex AI training image it
    runs on ("2-15"); None: no prebuilt image has what it needs, so a Vertex
    job needs ``--container-image``."""
    image_requires: Tuple[str, ...] = ()
    """Requirements its uploaded sdist adds on that prebuilt image."""
    marker: Optional[Callable[[str], bool]] = None
    """``fn(model_dir) -> bool``: its own checkpoint files are in a local
    model dir, judged from file names without TensorFlow; None where its
    checkpoints are TensorFlow's (see :attr:`claims`)."""
    claims: Optional[Callable] = None
    """``fn(reader) -> bool`` for a TensorFlow checkpoint's
    ``tf.train.CheckpointReader``: this engine wrote it. Entries are asked
    in registry order."""
    claims_the_rest: bool = False
    """It wrote every TensorFlow checkpoint that no entry's :attr:`claims`
    accepts (a plain object-based checkpoint of a Keras model)."""
    newest: Optional[Callable[[str], Optional[str]]] = None
    """``fn(model_dir)``: its newest checkpoint where :attr:`marker` is set
    (TensorFlow checkpoints are found by TensorFlow)."""
    refuse_model_dir: Optional[Callable[[str, str], None]] = None
    """``fn(model_dir, engine)``: raises EngineMismatchError where ``engine``
    (another engine, not among those that list it in :attr:`continues`)
    cannot continue a model dir this one wrote, or None where every engine
    can."""
    continues: Tuple[str, ...] = ()
    """Other engines whose model dirs it continues (their checkpoints load)."""
    no_tf_multi_worker: str = ""
    """Why it does not train under TensorFlow's MultiWorkerMirroredStrategy
    (a TF_CONFIG cluster, a TFJob), or "" where it does."""
    no_bfloat16: Optional[Callable[[str, object], str]] = None
    """``fn(strategy, model) -> str``: why it cannot train ``model`` (a Keras
    model) in mixed_bfloat16 under that strategy ("" where it can), or None
    where it always can; "auto" precision then stays float32 and an explicit
    mixed_bfloat16 is refused."""
    image_hint: str = ""
    """Where no prebuilt image serves it: what its image must hold, and how
    to build one."""
    warning: Optional[Callable] = None
    """``fn(backend, platform, model, processes) -> str or None``: a warning
    for a setup known to be much slower for ``model``."""
    packages: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    """(name, distributions) of what it trains with besides its Keras
    backends (``("tf_keras", ("tf-keras",))``): their installed versions are
    what a tracked run records (:meth:`installed_versions`)."""

    @property
    def backends(self):
        """The names of :attr:`keras_backends`."""
        return tuple(backend.name for backend in self.keras_backends)

    @property
    def multi_process_backends(self):
        """Of :attr:`backends`, those on which several processes train together."""
        return tuple(backend.name for backend in self.keras_backends if backend.multi_process)

    def backend(self, name):
        """The :class:`Backend` of that name it trains on, or None."""
        return next((b for b in self.keras_backends if b.name == name), None)

    def refusal(self, backend):
        """Why it refuses ``backend`` by name, or None."""
        return dict(self.refused_backends).get(backend)

    def installed_versions(self):
        """{name: version} of its :attr:`packages` and its Keras backends that
        are installed here (the first installed distribution of each), from
        package metadata alone."""
        wanted = self.packages + tuple((b.name, b.distributions or b.modules[:1])
                                       for b in self.keras_backends)
        found = {}
        for name, distributions in wanted:
            version = installed_version(*distributions)
            if version and name not in found:
                found[name] = version
        return found

    def check_cluster(self, ps=None, evaluator=None, workers=None, strategy=None,
                      environ=os.environ):
        """Refuses what this engine cannot run: parameter servers, an
        evaluator task, several training tasks, or a strategy; no TensorFlow
        is imported.

        Args:
          ps, evaluator, workers: how the caller asked for them ("--ps 1",
            "ps tasks in TF_CONFIG"...), or None when it did not.
          strategy: a strategy name ("auto" passes), or None.
          environ: where :attr:`Cluster.check` reads its settings (KERAS_BACKEND).

        Raises:
          ConfigError: naming what was asked and the engine that can run it.
        """
        spec = self.cluster
        asked = [a for a, task in ((workers, "worker"), (ps, "ps"), (evaluator, "evaluator"))
                 if a and task not in spec.tasks]
        if asked:
            asked = " and ".join(asked)
            runs_no = [text for task, text in (("worker", "other training tasks"),
                                               ("ps", "parameter servers"),
                                               ("evaluator", "evaluator task"))
                       if task not in spec.tasks]
            others = [entry.name for entry in entries() if entry.name != self.name and all(
                task in entry.cluster.tasks
                for task, a in (("worker", workers), ("ps", ps), ("evaluator", evaluator)) if a)]
            runs_no = " and no ".join([", no ".join(runs_no[:-1]), runs_no[-1]]
                                      if len(runs_no) > 1 else runs_no)
            raise ConfigError(
                f"the {self.name} engine {spec.how}: it runs no {runs_no}"
                f", so {asked} cannot be used with it. Drop {asked}"
                + (f", or use --engine {others[0]}{get(others[0]).cluster.where}."
                   if others else "."))
        if strategy and strategy != "auto" and strategy not in spec.strategies:
            runs_it = [entry.name for entry in entries() if strategy in entry.cluster.strategies]
            raise ConfigError(
                f"the {self.name} engine {spec.how}: it cannot train with --strategy {strategy}; "
                f"use one of {', '.join(('auto',) + spec.strategies)}"
                + (f", or --engine {runs_it[0]}{get(runs_it[0]).cluster.where}, which trains "
                   f"with it." if runs_it else "."))
        if spec.check is not None:
            spec.check(workers, strategy, environ)

    def cluster_info(self, environ=os.environ):
        """(this task's ClusterInfo, its process group or None): TF_CONFIG's
        cluster, or the group of processes it trains with outside
        TensorFlow's runtime (:attr:`processes`), whose roles it takes.
        Reads the environment only; no TensorFlow.

        Raises:
          ClusterConfigError: bad or partial cluster settings, naming the variable.
        """
        # pylint: disable-next=import-outside-toplevel  (launchers ask entries without it)
        from estimator_keras.distribute import tf_config
        info = tf_config.parse_tf_config(env=environ)
        group = self.processes(environ, info) if self.processes is not None else None
        return (group.cluster_info() if group is not None else info), group

    def choose_strategy(self, requested, environ=os.environ):
        """(ClusterInfo, process group or None, strategy name) of this task
        training on this engine with ``--strategy requested``: a strategy the
        engine never runs is refused before the cluster is read for what that
        strategy needs (ps tasks...), and the cluster's tasks and the chosen
        strategy before any strategy exists (one may wait for its peers).
        Counts GPUs (importing TensorFlow) only for "auto" and "mirrored".

        Raises:
          ConfigError: what the engine or the cluster cannot run.
          ClusterConfigError: bad or partial cluster settings.
        """
        # pylint: disable-next=import-outside-toplevel  (it counts GPUs with TensorFlow)
        from estimator_keras.distribute import strategy as strategy_lib
        self.check_cluster(strategy=requested, environ=environ)
        info, group = self.cluster_info(environ)
        gpus = strategy_lib.local_gpu_count() if requested in ("auto", "mirrored") else 0
        name = strategy_lib.choose_strategy(requested, info, gpus)
        # choose_strategy has already refused parameter_server without ps tasks.
        self.check_cluster(
            ps="the ps tasks in TF_CONFIG" if info.has_ps else None,
            evaluator="an evaluator task (TF_CONFIG)" if info.is_evaluator else None,
            workers=(f"the {info.num_workers} training tasks in TF_CONFIG"
                     if info.num_workers > 1 else None),
            strategy=name, environ=environ)
        return info, group, name

    def facts(self):
        """What the entry says, in words: {field: text}, in the order
        ``show --engine`` and the docs' engine table give them."""
        return {
            "engine": self.name,
            "trains with": self.summary,
            "tf.keras": f"Keras {self.keras}",
            "Keras backends": ", ".join(self.backends) or "TensorFlow's own",
            "several processes": (", ".join(self.multi_process_backends)
                                  if self.backends else "yes" if "worker" in self.cluster.tasks
                                  else "no"),
            "refused Keras backends": "; ".join(f"{name}: {why}"
                                                for name, why in self.refused_backends) or "none",
            "--engine auto": (f"rank {self.auto:g}" + (f", {self.auto_when}" if self.auto_when
                                                       else "")
                              if self.auto else "only for the model dirs it wrote"),
            "cluster tasks": ", ".join(self.cluster.tasks),
            "strategies": ", ".join(self.cluster.strategies),
            "cloud jobs": ", ".join(self.job_kinds) or "none",
            "TrainJob runtime": self.trainjob_runtime or "none",
            "Vertex AI image": (f"Google's prebuilt TensorFlow {self.prebuilt_image.replace('-', '.')}"
                                + (f" + {', '.join(self.image_requires)}"
                                   if self.image_requires else "")
                                if self.prebuilt_image else "your own (--container-image)"),
            "continues model dirs of": ", ".join(self.continues) or "itself only",
            "implemented in": self.engine.split(":")[0].rsplit(".", 1)[0],
        }


_ENTRIES: Dict[str, Entry] = {}


def _load_built_in():
    if not _ENTRIES:
        for module in BUILT_IN:
            entry = importlib.import_module(module).ENTRY
            _ENTRIES.setdefault(entry.name, entry)


def register(entry):
    """Adds (or replaces) an engine; it is asked like the built-in ones."""
    if not isinstance(entry, Entry):
        raise TypeError(f"register() takes a registry.Entry, got {type(entry).__name__}")
    if entry.name == AUTO:
        raise ConfigError(f"an engine cannot be named {AUTO!r}: that is --engine's default")
    _load_built_in()
    _ENTRIES[entry.name] = entry


def unregister(name):
    """Removes an engine added with :func:`register`."""
    _load_built_in()
    if name in (importlib.import_module(m).ENTRY.name for m in BUILT_IN):
        raise ValueError(f"{name!r} is a built-in engine")
    _ENTRIES.pop(name, None)


def entries():
    """Every engine's entry, built-in ones first."""
    _load_built_in()
    return list(_ENTRIES.values())


def names():
    """Every engine's name, in registry order."""
    return tuple(entry.name for entry in entries())


def choices():
    """``--engine``'s choices: "auto" and every engine."""
    return (AUTO,) + names()


def get(name):
    """The entry of ``name``; ConfigError naming the choices when unknown."""
    _load_built_in()
    if name not in _ENTRIES:
        raise ConfigError(f"unknown engine {name!r}; expected one of {', '.join(names())}.")
    return _ENTRIES[name]


def find(name):
    """The entry of ``name``, or None."""
    _load_built_in()
    return _ENTRIES.get(name)


def auto_order():
    """The entries ``--engine auto`` considers, in its order."""
    return sorted((entry for entry in entries() if entry.auto), key=lambda entry: entry.auto)


def auto_rule():
    """``--engine auto``'s order in words, for ``list`` and ``--help``."""
    return ", else ".join(f"{entry.name} {entry.auto_when}".strip() for entry in auto_order())


def installed_versions():
    """{name: version} of what the engines train with that is installed
    here (each entry's :meth:`Entry.installed_versions`, in registry order),
    from package metadata alone."""
    found = {}
    for entry in entries():
        for name, version in entry.installed_versions().items():
            found.setdefault(name, version)
    return found


def with_job_kind(kind):
    """The names of the engines a cloud job of ``kind`` runs."""
    return tuple(entry.name for entry in entries() if kind in entry.job_kinds)
