"""Train, evaluate and export a registered experiment (importable logic of
the ``train``, ``evaluate`` and ``export`` commands).

Example::

    from experiments import registry, train
    exp = registry.get("fashion_mnist_cnn")
    result = train.train(exp, exp.config, model_dir="runs/fm", data_dir="data")
    print(result.metrics, result.export_dir)
"""

import contextlib
import dataclasses
import logging
import os
import posixpath
import shutil
import sys
import time

from estimator_keras import cluster as cluster_lib
from estimator_keras import engines
from estimator_keras import estimator as est_lib
from estimator_keras import export as export_lib
from estimator_keras import fit as fit_lib
from estimator_keras import inputs, records
from estimator_keras.errors import DataError
from estimator_keras.modeldir import ModelDirLock
from experiments import datasets

logger = logging.getLogger(__name__)

DATA_WAIT_SECS = 600


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


def say(message):
    """Progress for people, on stderr (stdout carries the results)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def compiled_model(experiment, config):
    model = experiment.build_model(config.model)
    model.compile(optimizer=est_lib.legacy_optimizer(config.train.optimizer,
                                                     config.train.learning_rate),
                  loss=config.loss, metrics=experiment.metrics())
    return model


def ensure_data(config, data_dir, source_dir=None, is_chief=True, num_workers=1):
    """The dataset directory, prepared first if missing (by the chief only;
    other tasks wait for its manifest)."""
    name = config.data.dataset
    if datasets.is_prepared(data_dir, name):
        return datasets.dataset_dir(data_dir, name)
    if is_chief:
        say(f"dataset {name} is not in {data_dir}: preparing it first")
        return datasets.prepare(name, data_dir, source_dir=source_dir,
                                num_workers=num_workers)
    deadline = time.monotonic() + DATA_WAIT_SECS
    while time.monotonic() < deadline:
        if datasets.is_prepared(data_dir, name):
            return datasets.dataset_dir(data_dir, name)
        time.sleep(2)
    raise DataError(f"dataset {name} did not appear in {data_dir} within "
                    f"{DATA_WAIT_SECS} s; the chief prepares it, or run "
                    f"`python -m experiments prepare {name} --data-dir {data_dir}` first.")


def input_fns(config, dataset_path, info=None, skip_corrupt=False):
    """Train and eval input_fns over the experiment's dataset."""
    data = config.data
    input_config = inputs.InputConfig(
        features=data.features, label=data.label, shuffle=data.shuffle,
        shuffle_buffer=data.shuffle_buffer, cache=data.cache,
        skip_corrupt=skip_corrupt, seed=None)
    shard = None
    if info is not None and info.has_ps and info.task_type in cluster_lib.TRAINING_TYPES:
        # Parameter-server workers get no InputContext: split the files
        # between chief and workers from TF_CONFIG instead.
        order = info.cluster.get("chief", []) + info.cluster.get("worker", [])
        shard = (len(order), order.index(info.task_address))
    train_fn = inputs.make_input_fn(dataset_path, config.train.batch_size, training=True,
                                    split=data.train_split, config=input_config, shard=shard)
    eval_fn = inputs.make_input_fn(dataset_path, config.train.batch_size, training=False,
                                   split=data.eval_split, config=input_config)
    return train_fn, eval_fn


def check_inputs(model, config, dataset_path):
    """Fails before training when records do not fit the model's inputs,
    with expected and found side by side."""
    from estimator_keras.errors import SchemaError  # pylint: disable=import-outside-toplevel

    schema = records.resolve(dataset_path, config.data.train_split, check_sizes=False).schema
    mapping = inputs.feature_map(schema, config.data.features, config.data.label)
    est_lib.check_feature_keys(model, mapping)
    for input_name, tensor in zip(model.input_names, model.inputs):
        spec = schema[mapping[input_name]]
        expected = tuple(tensor.shape[1:])
        if spec.encoding in ("bytes",) or tuple(spec.shape) != expected:
            raise SchemaError(
                f"record feature {mapping[input_name]!r} does not fit model input "
                f"{input_name!r}: the model expects shape {list(expected)} "
                f"(numeric), the records hold {spec.dtype} shape {list(spec.shape)} "
                f"({spec.encoding}) in {dataset_path}.")
    return schema, mapping


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
    info = cluster_lib.parse_tf_config()
    engine = _engine_for(engine, model_dir)
    # Strategy first: MultiWorkerMirroredStrategy must precede any eager op.
    strategy_name = cluster_lib.choose_strategy(
        strategy, info, cluster_lib.local_gpu_count() if strategy in ("auto", "mirrored") else 0)
    if engine == "keras":
        # choose_strategy has already refused parameter_server without ps tasks.
        engines.check_keras_cluster(
            ps="the ps tasks in TF_CONFIG" if info.has_ps else None,
            evaluator="an evaluator task (TF_CONFIG)" if info.is_evaluator else None)
    distribute = cluster_lib.make_train_distribute(strategy_name, cluster_info=info)
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    replicas = cluster_lib.num_replicas(distribute)

    def log(message):
        say(f"[{info.task_name}] {message}")

    if strategy_name == "parameter_server":
        # Asynchronous updates: every worker step is one global step of one
        # batch, so examples/s = global steps/s x batch size, with no replica
        # factor (one would double-count).
        log(f"experiment {config.name}: strategy {strategy_name}, batch size "
            f"{config.train.batch_size} per update, {info.num_workers} training task(s) "
            f"updating asynchronously; engine {engine}")
    else:
        log(f"experiment {config.name}: strategy {strategy_name}, batch size "
            f"{config.train.batch_size} per replica, {config.train.batch_size * replicas} "
            f"global ({replicas} replica(s)); engine {engine}")

    dataset_path = ensure_data(config, data_dir, source_dir, is_chief=info.is_chief,
                               num_workers=prepare_workers)
    tf.keras.utils.set_random_seed(config.train.seed)
    # One uncompiled copy checks the records and any checkpoint against the model.
    probe = experiment.build_model(config.model)
    check_inputs(probe, config, dataset_path)
    train_fn, eval_fn = input_fns(config, dataset_path, info, skip_corrupt)
    if skip_corrupt and info.is_chief:
        _report_corrupt(train_fn.files)

    def build():
        return experiment.build_model(config.model)

    lock = ModelDirLock(model_dir) if info.is_chief else None
    if lock:
        lock.acquire()
    try:
        if info.is_chief:
            # Exports are the chief's alone; other tasks may start before the
            # chief has created the model dir.
            export_lib.recover_export(posixpath.join(str(model_dir), export_lib.EXPORT_DIR))
        latest = tf.train.latest_checkpoint(str(model_dir))
        if latest:
            export_lib.check_compatible(probe, latest)
            if engine == "estimator":
                fit_lib.check_estimator_can_restore(latest)
                log(f"resuming from {latest}")
        early = None
        if config.train.early_stopping_steps:
            early = est_lib.EarlyStopping(config.best_metric,
                                          config.train.early_stopping_steps,
                                          config.higher_is_better)
        run = _fit if engine == "keras" else _train_and_evaluate
        with _data_errors_explained(dataset_path, train_fn, eval_fn):
            metrics, checkpoint = run(experiment, config, model_dir=model_dir,
                                      distribute=distribute, info=info, replicas=replicas,
                                      train_fn=train_fn, eval_fn=eval_fn, early=early,
                                      build=build, log=log)
        if info.is_chief:
            export_dir = export_lib.export_model(
                build, model_dir, checkpoint=checkpoint, schema=train_fn.files.schema,
                features=config.data.features, export_dir=export_dir,
                metadata={"experiment": config.name, "engine": engine, "metrics": metrics,
                          "dataset": dataset_path})
            if tensorboard_dir and tensorboard_dir.rstrip("/") != str(model_dir).rstrip("/"):
                _copy_summaries(model_dir, tensorboard_dir)
        else:
            export_dir = None
            if (engine == "estimator" and info.task_type == "worker"
                    and strategy_name == "multi_worker_mirrored"):
                _remove_scratch(model_dir, info)
        step = int(metrics["global_step"]) if metrics and "global_step" in metrics else None
        return TrainResult(metrics, export_dir, step, info.task_name,
                           time.monotonic() - start)
    finally:
        if lock:
            lock.release()


def _engine_for(requested, model_dir):
    """resolve_engine, except that "auto" keeps a model dir the keras engine
    trained with the keras engine (the Estimator cannot restore it)."""
    if (requested or "auto") == "auto":
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        latest = tf.train.latest_checkpoint(str(model_dir))
        if latest and fit_lib.checkpoint_engine(latest) == "keras":
            requested = "keras"
    return engines.resolve_engine(requested)


def _train_and_evaluate(experiment, config, *, model_dir, distribute, info, replicas,
                        train_fn, eval_fn, early, build, log):
    """The estimator engine; returns (metrics, checkpoint to export)."""
    if not info.is_chief:
        _wait_for_warm_start(model_dir, log)
    estimator = est_lib.to_estimator(compiled_model(experiment, config),
                                     config=est_lib.run_config(
        model_dir, save_checkpoints_steps=config.train.eval_every_steps,
        keep_checkpoint_max=config.train.keep_checkpoint_max,
        log_every_steps=config.train.log_every_steps, train_distribute=distribute,
        seed=config.train.seed))
    if info.is_evaluator:
        _log_evaluations(estimator, log)
    best = export_lib.BestExporter(build, config.best_metric, config.higher_is_better,
                                   schema=train_fn.files.schema,
                                   features=config.data.features, log=log)
    metrics = est_lib.train_and_evaluate(
        estimator, train_fn, eval_fn, max_steps=config.train.max_steps,
        eval_every_steps=config.train.eval_every_steps,
        batch_size=config.train.batch_size, replicas=replicas,
        log_every_steps=config.train.log_every_steps, early_stopping=early,
        exporters=[best], log=log)
    if info.is_chief and metrics is None:
        # In a cluster only the evaluator evaluates; the chief's summary
        # needs the final numbers too.
        metrics = _plain(estimator.evaluate(eval_fn))
    return metrics, None


def _wait_for_warm_start(model_dir, log):
    """model_to_estimator writes the initial weights to MODEL_DIR/keras/ unless
    a checkpoint is there; tasks writing it at the same time break each
    other's save ("MergeV2Checkpoints ... No such file"). The chief writes it;
    the other tasks wait for it."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    keras_dir = posixpath.join(str(model_dir), "keras")
    deadline = time.monotonic() + DATA_WAIT_SECS
    waited = False
    while not tf.train.latest_checkpoint(keras_dir):
        if time.monotonic() > deadline:
            raise DataError(f"the chief did not write the initial weights to {keras_dir} "
                            f"within {DATA_WAIT_SECS} s; is the chief task running with the "
                            f"same --model-dir?")
        if not waited:
            log(f"waiting for the chief to write the initial weights to {keras_dir}")
            waited = True
        time.sleep(0.5)


def _fit(experiment, config, *, model_dir, distribute, info, replicas, train_fn, eval_fn,
         early, build, log):
    """The keras engine; returns (metrics, checkpoint to export)."""
    del info, replicas  # fit reads both from the strategy

    def on_evaluation(checkpoint, metrics):
        export_lib.export_if_best(build, model_dir, checkpoint, metrics, config.best_metric,
                                  config.higher_is_better, schema=train_fn.files.schema,
                                  features=config.data.features, log=log)

    result = fit_lib.fit_and_evaluate(
        lambda: keras_compiled_model(experiment, config),
        lambda ctx: train_fn(input_context=ctx), lambda ctx: eval_fn(input_context=ctx),
        model_dir=model_dir, max_steps=config.train.max_steps,
        eval_every_steps=config.train.eval_every_steps, batch_size=config.train.batch_size,
        strategy=distribute, keep_checkpoint_max=config.train.keep_checkpoint_max,
        log_every_steps=config.train.log_every_steps, early_stopping=early,
        on_evaluation=on_evaluation, log=log)
    return result.metrics, result.checkpoint


def keras_compiled_model(experiment, config):
    """The experiment's model compiled for the keras engine (current Keras
    optimizers; the Estimator needs the legacy ones)."""
    model = experiment.build_model(config.model)
    model.compile(optimizer=fit_lib.keras_optimizer(config.train.optimizer,
                                                    config.train.learning_rate),
                  loss=config.loss, metrics=experiment.metrics())
    return model


@contextlib.contextmanager
def _data_errors_explained(dataset_path, train_fn, eval_fn):
    """TensorFlow's data errors -> messages naming the files and the fix."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

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
            f"schema ({records.short_tf_error(e)}). Check them with `python -m "
            f"experiments inspect {dataset_path} --verify`, or rerun with "
            f"--skip-corrupt to drop the batches that fail.") from e


def _copy_summaries(model_dir, tensorboard_dir):
    """Copies the event files (train and eval/) to where the platform's
    TensorBoard looks."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from estimator_keras.cloud import copy_to_remote  # pylint: disable=import-outside-toplevel
    for sub in ("", "eval") + fit_lib.SUMMARY_SUBDIRS:
        src = posixpath.join(str(model_dir), sub) if sub else str(model_dir)
        for path in tf.io.gfile.glob(posixpath.join(src, "events.out.tfevents.*")):
            dst = posixpath.join(tensorboard_dir, sub, posixpath.basename(path))
            copy_to_remote(path, dst)


def _log_evaluations(estimator, log):
    # In a cluster train_and_evaluate returns nothing and TensorFlow's own
    # "Saving dict" lines are silenced: without this the evaluator's log would
    # not show a single number.
    evaluate = estimator.evaluate

    def logged(*args, **kwargs):
        metrics = evaluate(*args, **kwargs)
        shown = ", ".join(f"{k} {float(v):.4f}" for k, v in sorted(metrics.items())
                          if k != "global_step")
        log(f"evaluated step {int(metrics.get('global_step', -1))}: {shown}")
        return metrics

    estimator.evaluate = logged


def _plain(metrics):
    return {k: (float(v) if hasattr(v, "__float__") else v) for k, v in metrics.items()}


def _remove_scratch(model_dir, info):
    # Non-chief MultiWorkerMirrored workers checkpoint into a scratch dir the
    # chief never reads.
    scratch = posixpath.join(str(model_dir), f"tmp_worker_{info.task_index}")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    if tf.io.gfile.exists(scratch):
        tf.io.gfile.rmtree(scratch)


def _name_corrupt_files(error, *file_sets):
    """TensorFlow's DataLossError names a byte offset but not the file: find
    the damaged file(s) so the message can name them."""
    from estimator_keras.errors import CorruptRecordError  # pylint: disable=import-outside-toplevel

    broken = []
    for files in file_sets:
        for path in files.files:
            check = records.check_file(path, files.compression)
            if not check.ok:
                broken.append(check)
    if not broken:
        return CorruptRecordError(f"reading the records failed: {records.short_tf_error(error)}")
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
        check = records.check_file(path, files.compression)
        if not check.ok:
            where = f" at byte {check.offset}" if check.offset is not None else ""
            say(f"warning: {path} is corrupt{where} ({check.error}); --skip-corrupt: "
                f"training on its {check.num_records} good records before the damage "
                f"and skipping the rest of that file")


def evaluate(experiment, config, *, model_dir, data_dir, source_dir=None, engine="auto"):
    """Evaluates the latest checkpoint of ``model_dir`` on the eval split
    (a checkpoint of either engine, with either engine)."""
    engine = _engine_for(engine, model_dir)
    dataset_path = ensure_data(config, data_dir, source_dir)
    checkpoint = export_lib.latest_checkpoint(model_dir)
    export_lib.check_compatible(experiment.build_model(config.model), checkpoint)
    _, eval_fn = input_fns(config, dataset_path)
    if engine == "keras":
        return fit_lib.evaluate_checkpoint(lambda: keras_compiled_model(experiment, config),
                                           checkpoint, eval_fn())
    fit_lib.check_estimator_can_restore(checkpoint)
    estimator = est_lib.to_estimator(compiled_model(experiment, config),
                                     config=est_lib.run_config(model_dir))
    return _plain(estimator.evaluate(eval_fn, checkpoint_path=checkpoint))


def export(experiment, config, *, model_dir, data_dir=None, export_dir=None):
    """Exports the latest checkpoint of ``model_dir`` (model.h5, weights.h5,
    saved_model/)."""
    schema = None
    if data_dir and datasets.is_prepared(data_dir, config.data.dataset):
        schema = records.load_manifest(
            datasets.dataset_dir(data_dir, config.data.dataset)).schema
    return export_lib.export_model(
        lambda: experiment.build_model(config.model), model_dir, schema=schema,
        features=config.data.features, export_dir=export_dir,
        metadata={"experiment": config.name})


def clean_model_dir(model_dir):
    """Removes a local model dir (used by ``train --fresh``)."""
    if os.path.isdir(model_dir):
        shutil.rmtree(model_dir)
