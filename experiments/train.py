"""Train, evaluate and export a registered experiment: the importable logic
of the ``train``, ``evaluate`` and ``export`` commands.

:func:`train` builds a :class:`~experiments.context.RunContext` once and hands
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
import time

import tensorflow as tf

from estimator_keras import checkpoints, engines, export as export_lib, io, manifest, verify
from estimator_keras.engines import base
from estimator_keras.engines.keras import SUMMARY_SUBDIRS
from estimator_keras.errors import CorruptRecordError, DataError
from estimator_keras.modeldir import ModelDirLock
from experiments import context as context_lib
from experiments import datasets
from experiments.context import RunContext, say


@dataclasses.dataclass
class TrainResult:
    """What a ``train`` run produced.

    Attributes:
      metrics: final eval metrics (None on tasks that do not evaluate).
      export_dir: where the Keras exports are (None on non-chief tasks).
      global_step: the step the run ended at.
      task: the task name ("chief-0" when local).
      seconds: wall time.
    """

    metrics: dict
    export_dir: str
    global_step: int
    task: str
    seconds: float


class Runner:
    """Runs one task of a training run; :meth:`run` picks the role's method."""

    def __init__(self, context):
        self.ctx = context

    def run(self):
        roles = {"chief": self.chief, "worker": self.worker, "evaluator": self.evaluator,
                 "ps": self.ps}
        return roles[self.ctx.info.task_type]()

    # -- the roles

    def chief(self):
        """Trains (locally, or as the cluster's chief), then exports."""
        ctx = self.ctx
        if ctx.skip_corrupt:
            _report_corrupt(ctx.train_fn.files)
        with ModelDirLock(ctx.model_dir):
            export_lib.recover_export(io.join(ctx.model_dir, export_lib.EXPORT_DIR))
            self._check_checkpoint()
            result = self._train(is_chief=True)
            metrics = result.metrics
            if metrics is None:
                # In a cluster only the evaluator evaluates; the chief's
                # summary needs the final numbers too.
                metrics = ctx.engine.evaluate(self._plan(),
                                              checkpoints.latest_checkpoint(ctx.model_dir))
            export_dir = export_lib.export_model(
                ctx.build_model, ctx.model_dir, checkpoint=result.checkpoint, schema=ctx.schema,
                features=ctx.config.data.features, export_dir=ctx.export_dir,
                metadata={"experiment": ctx.config.name, "engine": ctx.engine.name,
                          "metrics": metrics, "dataset": ctx.dataset_path})
            if ctx.tensorboard_dir and ctx.tensorboard_dir.rstrip("/") != ctx.model_dir.rstrip("/"):
                _copy_summaries(ctx.model_dir, ctx.tensorboard_dir)
        return metrics, export_dir

    def worker(self):
        """Trains its share in step with the chief; exports nothing."""
        self._check_checkpoint()
        self._train(is_chief=False)
        if self.ctx.engine.name == "estimator" and self.ctx.strategy_name == "multi_worker_mirrored":
            # The Estimator's non-chief workers checkpoint into a scratch dir
            # the chief never reads.
            io.rmtree(base.scratch_dir(self.ctx.model_dir, self.ctx.info.task_index))
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

    def _plan(self):
        return self.ctx.plan(base.TrainingHooks(self.ctx.log, self._on_evaluation))

    def _train(self, is_chief):
        ctx = self.ctx
        plan = self._plan()
        ctx.engine.prepare(plan, is_chief)
        with _data_errors_explained(ctx.dataset_path, ctx.train_fn, ctx.eval_fn):
            return ctx.engine.train(plan)

    def _check_checkpoint(self):
        """A checkpoint in the model dir must fit the model and the engine."""
        latest = tf.train.latest_checkpoint(self.ctx.model_dir)
        if latest:
            checkpoints.check_compatible(self.ctx.probe, latest)
            if self.ctx.engine.name == "estimator":
                self.ctx.engine.check_can_restore(latest)
                self.ctx.log(f"resuming from {latest}")

    def _on_evaluation(self, checkpoint, metrics):
        ctx = self.ctx
        if ctx.engine.name == "estimator":
            # The keras engine logs its evaluations as fit reports them.
            ctx.log(f"evaluated step {int(metrics.get('global_step', -1))}: "
                    f"{base.format_metrics(metrics)}")
        export_lib.export_if_best(ctx.build_model, ctx.model_dir, checkpoint, metrics,
                                  ctx.config.best_metric, ctx.config.higher_is_better,
                                  schema=ctx.schema, features=ctx.config.data.features,
                                  log=ctx.log)


def train(experiment, config, *, model_dir, data_dir, source_dir=None, strategy="auto",
          engine="auto", skip_corrupt=False, prepare_workers=1, export_dir=None,
          tensorboard_dir=None):
    """Runs the experiment: prepare data if missing, train and evaluate,
    export (chief only). Works locally and as any task of a TF_CONFIG cluster.

    ``engine`` is "estimator" (train_and_evaluate), "keras" (Model.fit) or
    "auto" (the Estimator where it exists). ``export_dir`` defaults to
    ``MODEL_DIR/export``; ``tensorboard_dir``, when it differs from the model
    dir (Vertex's AIP_TENSORBOARD_LOG_DIR), gets a copy of the summaries at
    the end."""
    start = time.monotonic()
    ctx = RunContext.build(experiment, config, model_dir=model_dir, data_dir=data_dir,
                           source_dir=source_dir, strategy=strategy, engine=engine,
                           skip_corrupt=skip_corrupt, prepare_workers=prepare_workers,
                           export_dir=export_dir, tensorboard_dir=tensorboard_dir)
    metrics, exported = Runner(ctx).run()
    step = int(metrics["global_step"]) if metrics and "global_step" in metrics else None
    return TrainResult(metrics, exported, step, ctx.info.task_name, time.monotonic() - start)


def evaluate(experiment, config, *, model_dir, data_dir, source_dir=None, engine="auto"):
    """Evaluates the latest checkpoint of ``model_dir`` on the eval split
    (a checkpoint of either engine, with either engine)."""
    engine = engines.get_engine(context_lib.engine_for(engine, model_dir))
    dataset_path = context_lib.ensure_data(config, data_dir, source_dir)
    checkpoint = checkpoints.latest_checkpoint(model_dir)
    checkpoints.check_compatible(experiment.build_model(config.model), checkpoint)
    _, eval_fn = context_lib.input_fns(config, dataset_path)
    plan = context_lib.experiment_plan(experiment, config, model_dir=model_dir, eval_data=eval_fn)
    return engine.evaluate(plan, checkpoint)


def export(experiment, config, *, model_dir, data_dir=None, export_dir=None):
    """Exports the latest checkpoint of ``model_dir`` (model.h5, weights.h5,
    saved_model/)."""
    schema = None
    if data_dir and datasets.is_prepared(data_dir, config.data.dataset):
        schema = manifest.load_manifest(
            datasets.dataset_dir(data_dir, config.data.dataset)).schema
    return export_lib.export_model(
        lambda: experiment.build_model(config.model), model_dir, schema=schema,
        features=config.data.features, export_dir=export_dir,
        metadata={"experiment": config.name})


@contextlib.contextmanager
def _data_errors_explained(dataset_path, train_fn, eval_fn):
    """TensorFlow's data errors -> messages naming the files and the fix."""
    try:
        yield
    except tf.errors.DataLossError as e:
        raise _name_corrupt_files(e, train_fn.files, eval_fn.files) from e
    except (tf.errors.InvalidArgumentError, UnicodeDecodeError) as e:
        # Records that frame correctly but do not parse to the schema (a
        # record that is no tf.train.Example at all makes TensorFlow fail
        # to decode its own message: UnicodeDecodeError).
        raise DataError(
            f"training stopped: records in {dataset_path} do not match the dataset's "
            f"schema ({verify.short_tf_error(e)}). Check them with `python -m "
            f"experiments inspect {dataset_path} --verify`, or rerun with "
            f"--skip-corrupt to drop the batches that fail.") from e


def _copy_summaries(model_dir, tensorboard_dir):
    """Copies the event files (train and eval/) to where the platform's
    TensorBoard looks."""
    for sub in ("", "eval") + SUMMARY_SUBDIRS:
        src = io.join(model_dir, sub) if sub else model_dir
        for path in io.glob(io.join(src, "events.out.tfevents.*")):
            io.makedirs(io.join(tensorboard_dir, sub))
            io.copy_file(path, io.join(tensorboard_dir, sub, io.basename(path)))


def _name_corrupt_files(error, *file_sets):
    """TensorFlow's DataLossError names a byte offset but not the file: find
    the damaged file(s) so the message can name them."""
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
    for path in files.files:
        check = verify.check_file(path, files.compression)
        if not check.ok:
            where = f" at byte {check.offset}" if check.offset is not None else ""
            say(f"warning: {path} is corrupt{where} ({check.error}); --skip-corrupt: "
                f"training on its {check.num_records} good records before the damage "
                f"and skipping the rest of that file")
