"""Train, evaluate and export a registered experiment: the importable logic
of the ``train``, ``evaluate`` and ``export`` commands.

:func:`train` builds a :class:`~experiments.training.context.RunContext` once and hands
it to a :class:`Runner`, which has one method per task role: the chief
(prepares data, takes the model-dir lock, exports), a worker, the evaluator
and a parameter server. The same code runs a local process (a chief) and
every task of a TF_CONFIG cluster.

Example::

    from experiments import catalog, registry, train
    catalog.load()
    exp = registry.get("fashion_mnist_cnn")
    result = train.train(exp, exp.config, model_dir="runs/fm", data_dir="data")
    print(result.metrics, result.export_dir)
"""

import contextlib
import dataclasses
import sys
import time

from estimator_keras import engines, export as export_lib, io, manifest, summaries
from estimator_keras import losses, tf_errors
from estimator_keras.cloud import hypertune, trainjob_status
from estimator_keras.distribute.preemption import DEFAULT_GRACE_SECS, PreemptionWatch
from estimator_keras.engines import base, registry
from estimator_keras.errors import (ConfigError, CorruptRecordError, DataError, EstimatorKerasError,
                                    ModelDirError, Preempted, TensorFlowError)
from estimator_keras.modeldir import ModelDirLock
from experiments.catalog import datasets
from experiments.config import files as config_files
from experiments.config import data_info
from experiments.training import context as context_lib
from experiments.training import tracked
from experiments.training.context import RunContext, say


@dataclasses.dataclass
class TrainResult:
    """What a ``train`` run produced.

    Attributes:
      metrics: final eval metrics (None on tasks that do not evaluate).
      export_dir: where the Keras exports are (None on non-chief tasks).
      global_step: the step the run ended at.
      task: the task name ("chief-0" when local).
      seconds: wall time.
      evaluated: what ``metrics`` were measured on: split, examples (None
        when unknown) and checkpoint step.
      trained: False when the model dir was already at ``max_steps``.
    """

    metrics: dict
    export_dir: str
    global_step: int
    task: str
    seconds: float
    evaluated: dict = None
    trained: bool = True


class Runner:
    """Runs one task of a training run; :meth:`run` picks the role's method."""

    def __init__(self, context):
        self.ctx = context
        # Set on a chief whose best-model exports would hold its group up.
        self.best = None
        # The chief's reports into a Kubeflow TrainJob's status, where it has one.
        self.status = None
        # The chief's record in MLflow, with --track.
        self.tracking = None

    def run(self):
        roles = {"chief": self.chief, "worker": self.worker, "evaluator": self.evaluator,
                 "ps": self.ps}
        return roles[self.ctx.info.task_type]()

    # -- the roles

    def chief(self):
        """Trains (locally, or as the cluster's chief), then exports; reports
        the progress into a Kubeflow TrainJob's status where the job has one."""
        self.status = trainjob_status.from_environment(self.ctx.config.train.max_steps,
                                                       self.ctx.log)
        if self.status is None:
            return self._chief()
        with self.status:  # a Preempted reports the step it reached
            metrics, export_dir = self._chief()
            self.status.finish(None, metrics)
        return metrics, export_dir

    def _chief(self):
        ctx = self.ctx
        if ctx.skip_corrupt:
            _report_corrupt(ctx.train_fn.files)
        with ModelDirLock(ctx.model_dir):
            export_lib.recover_export(self._export_dir())
            latest = self._check_checkpoint()
            if ctx.group.chief_work_stalls_others:
                self.best = export_lib.BestCandidate(ctx.model_dir, ctx.config.best_metric,
                                                     ctx.config.higher_is_better)
            if latest and (ctx.engine.checkpoint_step(latest) or 0) >= ctx.config.train.max_steps:
                # A candidate a run that died left behind.
                self._export_best()
                metrics, export_dir = self._already_trained(latest)
                tracked.repair(ctx, ctx.tracking_uri, export_dir, ctx.register)
                return metrics, export_dir
            # Only a run that trains: config.yaml describes what trained the
            # checkpoints, and one that trains none leaves it as it is.
            config_files.write(ctx.model_dir, ctx.config, ctx.dataset_path, ctx.data)
            ctx.store_order()
            self.tracking = tracked.start(ctx, ctx.tracking_uri, ctx.register)
            with self.tracking or contextlib.nullcontext():
                metrics, export_dir = self._train_and_export()
                if self.tracking is not None:
                    self.tracking.finish(metrics, export_dir)
        return metrics, export_dir

    def _train_and_export(self):
        ctx = self.ctx
        try:
            result = self._train(is_chief=True)
        except Preempted as e:
            if ctx.evaluations:
                ctx.evaluations.stopped(e.step)
            self._export_best()
            raise
        self._export_best()
        metrics = result.metrics
        if metrics is None:
            # In a cluster only the evaluator evaluates; the chief's
            # summary needs the final numbers too.
            metrics = ctx.engine.evaluate(self._plan(),
                                          ctx.engine.require_checkpoint(ctx.model_dir))
        export_dir = self._export(result.checkpoint, metrics)
        self._report(metrics)
        return metrics, export_dir

    def worker(self):
        """Trains its share in step with the chief; exports nothing."""
        ctx = self.ctx
        if (ctx.group.process_0_decides
                and ctx.start_step >= ctx.config.train.max_steps):
            # Process 0 trains nothing either (the step is its, see RunContext).
            ctx.log(f"process 0's model dir is already at step {ctx.start_step} (--max-steps "
                    f"{ctx.config.train.max_steps}): nothing to train")
            return None, None
        self._check_checkpoint()
        self._train(is_chief=False)
        self.ctx.engine.finish_worker(self.ctx.model_dir, self.ctx.info.task_index,
                                      self.ctx.strategy_name)
        return None, None

    def evaluator(self):
        """Evaluates every new checkpoint (and keeps MODEL_DIR/best) until
        training ends."""
        self._check_checkpoint()
        result = self._train(is_chief=False)
        return result.metrics, None

    def ps(self):
        """Serves the variables until the launcher ends it."""
        self._check_checkpoint()
        self._train(is_chief=False)
        return None, None

    # -- shared by the roles

    def _plan(self, preemption=None):
        hooks = base.TrainingHooks(self.ctx.log, self._on_evaluation, self._on_progress)
        return self.ctx.plan(hooks, preemption=preemption)

    def _train(self, is_chief):
        ctx = self.ctx
        # A task that found no checkpoint of its own (a JAX process but 0) refuses
        # with process 0 instead of waiting for it in the first step.
        ctx.check_order()
        # The evaluator runs no steps of its own: it stops at once on a
        # signal. A parameter server waits inside TensorFlow, where no Python
        # handler runs: it keeps the signals' own effect.
        watch = None if ctx.info.task_type == "ps" else PreemptionWatch(
            ctx.preemption_grace, log=ctx.log, stop_at_once=ctx.info.is_evaluator,
            saves=is_chief, final_checkpoint=self._final_checkpoint)
        plan = self._plan(preemption=watch)
        ctx.engine.prepare(plan, is_chief)
        with watch or contextlib.nullcontext(), _tensorflow_errors_explained(
                ctx.dataset_path, ctx.train_fn, ctx.eval_fn,
                ctx.info.task_name if ctx.info.is_distributed else None):
            return ctx.engine.train(plan)

    def _final_checkpoint(self):
        """The step of the model dir's checkpoint of the last step, or None."""
        ctx = self.ctx
        latest = ctx.engine.latest_checkpoint(ctx.model_dir)
        step = ctx.engine.checkpoint_step(latest) if latest else None
        return step if step is not None and step >= ctx.config.train.max_steps else None

    def _check_checkpoint(self):
        """A checkpoint in the model dir must fit the model and the engine;
        returns it (None when there is none)."""
        ctx = self.ctx
        latest = ctx.engine.latest_checkpoint(ctx.model_dir)
        if latest:
            try:
                ctx.engine.check_compatible(ctx.probe, latest)
            except ModelDirError:
                if ctx.changed:
                    raise config_files.refusal(ctx.model_dir, ctx.changed,
                                               architecture=True) from None
                raise
            if ctx.changed:
                raise config_files.refusal(ctx.model_dir, ctx.changed)
            ctx.engine.check_can_restore(latest)
            ctx.log_resume()
        return latest

    def _on_progress(self, step, loss, seconds_left, steps_per_sec=None):
        if self.status is not None:
            self.status.progress(step, loss, seconds_left)
        if self.tracking is not None:
            self.tracking.progress(step, loss, steps_per_sec)

    def _on_evaluation(self, checkpoint, metrics):
        ctx = self.ctx
        if self.status is not None:
            self.status.evaluation(metrics)
        if self.tracking is not None:
            self.tracking.evaluation(metrics)
        if ctx.evaluations:
            ctx.evaluations.record(metrics)
        if self.best is not None:
            if self.best.consider(checkpoint, metrics):
                ctx.log(f"best {ctx.config.best_metric} so far "
                        f"{float(metrics[ctx.config.best_metric]):.4f}: its checkpoint is set "
                        f"aside; {export_lib.BEST_DIR}/ is written when training ends")
            return
        ctx.engine.export_if_best(ctx.build_model, ctx.model_dir, checkpoint, metrics,
                                  ctx.config.best_metric, ctx.config.higher_is_better,
                                  **self._best_options())

    def _best_options(self):
        ctx = self.ctx
        return dict(schema=ctx.schema, features=ctx.config.data.features, log=ctx.log,
                    class_names=ctx.data.class_names,
                    output_activation=losses.output_activation(ctx.config.loss))

    def _export_best(self):
        """``best/`` of the candidate a group's chief set aside (see _on_evaluation)."""
        if self.best is not None:
            self.best.export(self.ctx.build_model, self.ctx.engine.export_if_best,
                             **self._best_options())

    def _report(self, metrics):
        """TensorBoard's HParams row of this run and a tuning trial's metric."""
        ctx = self.ctx
        log_dir = ctx.tensorboard_dir or ctx.model_dir
        step = int(metrics.get("global_step") or 0)
        summaries.write_hparams(io.join(log_dir, "hparams"),
                                {**dataclasses.asdict(ctx.config.train), **ctx.config.model},
                                metrics, step)
        if ctx.hypertune_metric:
            if ctx.hypertune_metric not in metrics:
                raise ConfigError(
                    f"--hypertune-metric {ctx.hypertune_metric!r} is not among the "
                    f"evaluation's metrics {sorted(k for k in metrics if k != 'global_step')}.")
            path = hypertune.report(ctx.hypertune_metric, metrics[ctx.hypertune_metric], step)
            ctx.log(f"reported {ctx.hypertune_metric} {metrics[ctx.hypertune_metric]:.4f} to "
                    f"the tuning service ({path})")

    def _export_dir(self):
        return self.ctx.export_dir or io.join(self.ctx.model_dir, export_lib.EXPORT_DIR)

    def _export(self, checkpoint, metrics):
        ctx = self.ctx
        return ctx.engine.export(
            ctx.build_model, ctx.model_dir, checkpoint=checkpoint, schema=ctx.schema,
            features=ctx.config.data.features, export_dir=ctx.export_dir,
            metadata=export_metadata(ctx.config, ctx.engine.name, ctx.dataset_path, metrics),
            class_names=ctx.data.class_names, flat=ctx.flat_export,
            output_activation=losses.output_activation(ctx.config.loss))

    def _already_trained(self, latest):
        """A model dir already at --max-steps trains nothing: it reports the
        numbers of its export, and writes the export only when missing."""
        ctx = self.ctx
        step = ctx.engine.checkpoint_step(latest)
        ctx.log(f"{ctx.model_dir} is already at step {step} (--max-steps "
                f"{ctx.config.train.max_steps}): nothing to train. Raise --max-steps to train on.")
        recorded = export_lib.read_export_info(self._export_dir())
        if export_lib.is_export_of(recorded, latest) and recorded.get("metrics"):
            ctx.log(f"the export in {self._export_dir()} is of that checkpoint: left as it is")
            return recorded["metrics"], self._export_dir()
        metrics = ctx.engine.evaluate(self._plan(), latest)
        return metrics, self._export(latest, metrics)


def export_metadata(config, engine, dataset_path, metrics):
    """What export.json records beside the model, the same from ``train`` and
    ``export``: experiment, engine, dataset, and the metrics of the exported
    checkpoint with the split they were measured on."""
    info = {"experiment": config.name, "engine": engine, "dataset": dataset_path,
            "eval_split": config.data.eval_split}
    if metrics:
        info["metrics"] = metrics
    return info


def train(experiment, config, *, model_dir, data_dir, source_dir=None, strategy="auto",
          engine="auto", skip_corrupt=False, prepare_workers=1, export_dir=None,
          tensorboard_dir=None, preemption_grace=DEFAULT_GRACE_SECS, flat_export=False,
          hypertune_metric=None, evaluations=None, track=None, register=None,
          restart_order=False):
    """Runs the experiment: prepare data if missing, train and evaluate,
    export (chief only). Works locally and as any task of a TF_CONFIG cluster.

    ``engine`` is "estimator" (train_and_evaluate), "keras" (Model.fit of
    Keras 2), "keras3" (Model.fit of Keras 3) or "auto" (see
    :func:`estimator_keras.engines.resolve_engine`). ``export_dir`` defaults to
    ``MODEL_DIR/export``; ``tensorboard_dir`` (Vertex's
    AIP_TENSORBOARD_LOG_DIR) gets the summaries as training writes them
    (default: the model dir). SIGTERM or SIGINT saves the current step within
    ``preemption_grace`` seconds and raises Preempted. ``flat_export`` writes
    the export in Vertex's layout; ``hypertune_metric`` reports that metric
    to Vertex's tuning service at the end; ``evaluations`` (an
    :class:`experiments.tuning.evaluations.Recorder`) records each evaluation as it
    happens. ``track`` records the run in MLflow (a tracking URI; "": the
    default, see :func:`estimator_keras.tracking.settings.resolve`; None:
    ``EK_TRACKING_URI`` decides), and ``register`` names the registered
    model its export becomes a version of (see :mod:`experiments.training.tracked`).
    ``restart_order``: where the settings that fix the input order changed
    since the checkpoint, start a fresh order at the next epoch boundary
    instead of refusing the run (see :mod:`estimator_keras.order_state`).

    Raises:
      Preempted: training stopped on a signal; rerunning resumes.
    """
    start = time.monotonic()
    ctx = RunContext.build(experiment, config, model_dir=model_dir, data_dir=data_dir,
                           source_dir=source_dir, strategy=strategy, engine=engine,
                           skip_corrupt=skip_corrupt, prepare_workers=prepare_workers,
                           export_dir=export_dir, tensorboard_dir=tensorboard_dir,
                           preemption_grace=preemption_grace, flat_export=flat_export,
                           hypertune_metric=hypertune_metric, evaluations=evaluations,
                           track=track, register=register, restart_order=restart_order)
    metrics, exported = Runner(ctx).run()
    step = int(metrics["global_step"]) if metrics and "global_step" in metrics else None
    evaluated = None
    if metrics:
        evaluated = {"split": config.data.eval_split, "step": step,
                     "examples": ctx.eval_fn.files.num_examples}
    return TrainResult(metrics, exported, step, ctx.info.task_name, time.monotonic() - start,
                       evaluated, trained=ctx.start_step < config.train.max_steps)


def evaluate(experiment, config, *, model_dir, data_dir, source_dir=None, engine="auto"):
    """Evaluates the latest checkpoint of ``model_dir`` on the eval split
    (a checkpoint of either engine, with either engine)."""
    engine = engines.get_engine(context_lib.engine_for(engine, model_dir))
    dataset_path = context_lib.ensure_data(config, data_dir, source_dir)
    data = data_info.describe(manifest.load_manifest(dataset_path), config.data)
    checkpoint = engine.require_checkpoint(model_dir)
    engine.check_compatible(_checked_model(experiment, config, data, engine), checkpoint)
    pipeline, _ = context_lib.choose_pipeline(config, registry.get(engine.name))
    _, eval_fn = context_lib.input_fns(config, dataset_path, pipeline=pipeline)
    plan = context_lib.experiment_plan(experiment, config, data, model_dir=model_dir,
                                       eval_data=eval_fn)
    return engine.evaluate(plan, checkpoint)


def export(experiment, config, *, model_dir, data_dir=None, export_dir=None, force=False):
    """Exports the latest checkpoint of ``model_dir`` with the engine that
    continues it (see :func:`experiments.training.context.engine_for`), as ``train``
    writes it: model.h5 (and on keras3 model.keras), weights.h5, saved_model/,
    export.json. Returns (export dir,
    whether it was written): an export of that checkpoint whose export.json
    is at least as complete is left as it is, unless ``force``.

    The metrics go into export.json when an evaluation of that checkpoint is
    on record (the train run's export, or the best-model export)."""
    engine = engines.get_engine(context_lib.engine_for("auto", model_dir))
    checkpoint = engine.require_checkpoint(model_dir)
    target = export_dir or io.join(model_dir, export_lib.EXPORT_DIR)
    export_lib.recover_export(target)
    export_lib.remove_stale_staging(target)
    known = None
    for folder in (target, io.join(model_dir, export_lib.EXPORT_DIR),
                   io.join(model_dir, export_lib.BEST_DIR)):
        info = export_lib.read_export_info(folder)
        if export_lib.is_export_of(info, checkpoint) and info.get("metrics"):
            known = info["metrics"]
            break
    recorded = export_lib.read_export_info(target)
    if not force and export_lib.is_export_of(recorded, checkpoint) and (
            recorded.get("metrics") or not known):
        return target, False
    dataset_path = schema = None
    data = config_files.recorded_data_info(model_dir)
    try:
        dataset_path, _ = datasets.find(config.data.dataset, data_dir or "data")
        found = manifest.load_manifest(dataset_path)
    except EstimatorKerasError:
        dataset_path = None  # the model dir's record says what the model needs
    else:
        schema, data = found.schema, data_info.describe(found, config.data)
    written = engine.export(
        lambda: _checked_model(experiment, config, data, engine), model_dir,
        checkpoint=checkpoint, schema=schema, features=config.data.features,
        export_dir=export_dir,
        metadata=export_metadata(config, engine.written_by(checkpoint), dataset_path, known),
        class_names=data.class_names if data is not None else None,
        output_activation=losses.output_activation(config.loss))
    return written, True


def _checked_model(experiment, config, data, engine):
    """The experiment's model, refused when it is not the engine's Keras."""
    model = experiment.make_model(config.model, data)
    engines.check_model_keras(model, engine.name,
                              source=f"experiment {config.name}'s model builder")
    return model


@contextlib.contextmanager
def _tensorflow_errors_explained(dataset_path, train_fn, eval_fn, task=None):
    """TensorFlow's errors -> messages that say what failed. Only what the
    input pipeline raised is the data's fault (see tf_errors); anything else
    is reported as TensorFlow's: the op, the task, one line of its message."""
    on_task = f" on task {task}" if task else ""
    schema_error = (f"training stopped{on_task}: records in {dataset_path} do not match the "
                    f"dataset's schema ({{}}). Check them with `python -m experiments inspect "
                    f"{dataset_path} --verify`, or rerun with --skip-corrupt to drop the "
                    f"batches that fail.")
    try:
        yield
    except UnicodeDecodeError as e:
        # A record that is no tf.train.Example at all makes TensorFlow fail
        # to decode its own message, which quotes the record.
        if not tf_errors.from_input_pipeline(e):
            raise
        raise DataError(schema_error.format(tf_errors.first_line(e))) from e
    except Exception as e:  # pylint: disable=broad-except  (TensorFlow's, re-raised otherwise)
        # Where TensorFlow is not imported, nothing raised its errors.
        tf = sys.modules.get("tensorflow")
        if tf is None or not isinstance(e, tf.errors.OpError):
            raise
        if not tf_errors.from_input_pipeline(e):
            raise TensorFlowError(tf_errors.describe(e, task)) from e
        if isinstance(e, tf.errors.DataLossError):
            raise _name_corrupt_files(e, train_fn.files, eval_fn.files) from e
        if isinstance(e, tf.errors.InvalidArgumentError):
            # Records that frame correctly but do not parse to the schema.
            raise DataError(schema_error.format(tf_errors.first_line(e))) from e
        raise DataError(f"training stopped{on_task}: reading {dataset_path} failed in op "
                        f"{tf_errors.failed_ops(e)[0]} ({type(e).__name__}): "
                        f"{tf_errors.first_line(e)}") from e


def _name_corrupt_files(error, *file_sets):
    """TensorFlow's DataLossError names a byte offset but not the file: find
    the damaged file(s) so the message can name them."""
    from estimator_keras import verify  # pylint: disable=import-outside-toplevel  (TensorFlow's)
    broken = []
    for files in file_sets:
        for path in files.files:
            check = verify.check_file(path, files.compression)
            if not check.ok:
                broken.append(check)
    if not broken:
        return CorruptRecordError(f"reading the records failed: {verify.short_tf_error(error)}")
    first = broken[0]
    where = ", ".join(
        f"{c.path} (after {c.num_records} good records"
        + (f", at byte {c.offset}" if c.offset is not None else "") + f": {c.error})"
        for c in broken)
    return CorruptRecordError(
        f"training stopped on corrupt data: {where}. Rewrite the dataset "
        f"(`python -m experiments prepare ... --force`), or rerun with --skip-corrupt "
        f"to train on the readable records.", path=first.path, offset=first.offset)


def _report_corrupt(files):
    """With --skip-corrupt: name the damaged files up front, and how many
    records they lose, since the pipeline then drops bad records silently."""
    from estimator_keras import verify  # pylint: disable=import-outside-toplevel  (TensorFlow's)
    for path in files.files:
        check = verify.check_file(path, files.compression)
        if not check.ok:
            where = f" at byte {check.offset}" if check.offset is not None else ""
            say(f"warning: {path} is corrupt{where} ({check.error}); --skip-corrupt: "
                f"training on its {check.num_records} good records before the damage "
                f"and skipping the rest of that file")
