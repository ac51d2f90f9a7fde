"""What a run decides once, before any task role runs: the task, the engine,
the strategy, the data and the input pipelines.

The order matters: TF_CONFIG is read and MultiWorkerMirroredStrategy created
before any eager TensorFlow op, then the data is found (or prepared by the
chief), and the model is built once to check the records against it.
TensorFlow is imported where it is installed (for its seeds and its ops'
determinism) and by the engines and pipelines that use it: the keras3
engine on JAX with Grain runs without it.
"""

import dataclasses
import sys
import time

import numpy as np

from estimator_keras import (engines, input_config as input_config_lib, losses, manifest,
                             model_inputs, order_state, pipeline_choice, precision, records)
from estimator_keras.distribute import groups
from estimator_keras.distribute import strategy as strategy_lib
from estimator_keras.distribute import tf_config, trainjob_pods
from estimator_keras.distribute.preemption import DEFAULT_GRACE_SECS
from estimator_keras.engines import base, keras_setup, optimizers, registry
from estimator_keras.errors import ConfigError, DataError, SchemaError
from estimator_keras.schema import feature_map
from estimator_keras.tracking import settings as tracking_settings
from experiments.catalog import datasets
from experiments.config import files as config_files
from experiments.config import data_info

# How long a non-chief task waits for the chief to prepare the data.
DATA_WAIT_SECS = 600


def say(message):
    """Progress for people, on stderr (stdout carries the results)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def task_log(info, message):
    """:func:`say`, with the task's name where there are several tasks to tell apart."""
    say(f"[{info.task_name}] {message}" if info.is_distributed else message)


def header_line(config, strategy_name, replicas, info, engine_name, how=None, runs_on=None,
                pipeline=None):
    """The run's first line: experiment, strategy (``how`` it runs, where
    that is not TensorFlow's), batch sizes and engine, with the backend and
    devices it ``runs_on`` ("jax, cpu") and the input ``pipeline`` that
    feeds it ("grain")."""
    train = config.train
    engine = f"{engine_name} ({runs_on})" if runs_on else engine_name
    if pipeline:
        engine += f"; input {pipeline}"
    if strategy_name == "parameter_server":
        # Asynchronous updates: every worker step is one global step of
        # one batch, so examples/s = global steps/s x batch size, with no
        # replica factor (one would double-count).
        return (f"experiment {config.name}: strategy {strategy_name}, batch size "
                f"{train.batch_size} per update, {info.num_workers} training "
                f"task(s) updating asynchronously; engine {engine}")
    strategy = f"{strategy_name} ({how})" if how else strategy_name
    return (f"experiment {config.name}: strategy {strategy}, batch size "
            f"{train.batch_size} per replica, {train.batch_size * replicas} "
            f"global ({replicas} replica(s)); engine {engine}")


def describe_devices(platform, count):
    """How the header names ``count`` devices of ``platform``: "cpu", "gpu", "4 gpus"."""
    return platform if count == 1 else f"{count} {platform}s"


def engine_for(requested, model_dir):
    """resolve_engine, except that "auto" keeps a model dir with the engine
    that wrote its checkpoint where this process can run that engine (the
    Estimator cannot restore the keras engine's checkpoints, Keras 2 cannot
    read keras3's); see :func:`estimator_keras.engines.auto_for_model_dir`."""
    return engines.resolve_engine(requested, model_dir=model_dir)


def ensure_data(config, data_dir, source_dir=None, is_chief=True, num_workers=1):
    """The dataset directory (see :func:`experiments.catalog.datasets.find`); a
    registered dataset is prepared first if missing (by the chief only; other
    tasks wait for its manifest)."""
    name = config.data.dataset
    found, missing = datasets.needs_preparing(name, data_dir)
    if not missing:
        return found
    if is_chief:
        say(f"dataset {name} is not in {data_dir}: preparing it first")
        # pylint: disable-next=import-outside-toplevel  (its importers load their readers)
        from experiments.catalog import prepare
        return prepare.prepare(name, data_dir, source_dir=source_dir, num_workers=num_workers)
    deadline = time.monotonic() + DATA_WAIT_SECS
    while time.monotonic() < deadline:
        if datasets.is_prepared(data_dir, name):
            return datasets.dataset_dir(data_dir, name)
        time.sleep(2)
    raise DataError(f"dataset {name} did not appear in {data_dir} within "
                    f"{DATA_WAIT_SECS} s; the chief prepares it, or run "
                    f"`python -m experiments prepare {name} --data-dir {data_dir}` first.")


def choose_pipeline(config, entry, backend=None):
    """``(pipeline, why)``: the input pipeline of ``config``'s data.pipeline
    that feeds the engine of registry ``entry`` on Keras 3's ``backend``
    (None: the one the environment names; see
    :func:`estimator_keras.pipeline_choice.choose`)."""
    backend = backend or keras_setup.keras_backend()[0]
    return pipeline_choice.choose(config.data.pipeline, entry.backend(backend),
                                  f"the {entry.name} engine")


def input_config(config, skip_corrupt=False, seed=None):
    """The :class:`~estimator_keras.inputs.InputConfig` of an experiment's data settings."""
    data = config.data
    return input_config_lib.InputConfig(
        features=data.features, label=data.label, shuffle=data.shuffle,
        shuffle_buffer=data.shuffle_buffer, cache=data.cache,
        cache_budget_mb=data.cache_budget_mb, cache_shuffle=data.cache_shuffle,
        skip_corrupt=skip_corrupt, seed=seed)


def input_fns(config, dataset_path, info=None, skip_corrupt=False, seed=None, shard=None,
              start_step=0, resume=None, cache_decided=None, pipeline="tfdata"):
    """Train and eval input_fns over the experiment's dataset; ``seed``
    makes their shuffles (and so the run) repeatable; ``shard``
    (processes, rank) gives this process its share of the training files
    where no ``tf.distribute.InputContext`` will; the training input
    resumes after the batches of ``start_step`` steps, or where ``resume``
    (an :class:`~estimator_keras.order_state.Decision`) says, with the
    cache decision ``cache_decided`` where one was made before; ``pipeline``
    names the pipeline that reads ("tfdata" or "grain", see
    :mod:`estimator_keras.pipeline_choice`)."""
    data = config.data
    make_input_fn = pipeline_choice.input_fn_maker(pipeline)
    shared = input_config(config, skip_corrupt, seed)
    if info is not None and info.has_ps and info.task_type in tf_config.TRAINING_TYPES:
        # Parameter-server workers get no InputContext: split the files
        # between chief and workers from TF_CONFIG instead.
        order = info.cluster.get("chief", []) + info.cluster.get("worker", [])
        shard = (len(order), order.index(info.task_address))
    train_fn = make_input_fn(dataset_path, config.train.batch_size, training=True,
                             split=data.train_split, shard=shard, start_step=start_step,
                             config=dataclasses.replace(shared, cache_decided=cache_decided),
                             resume=resume)
    eval_fn = make_input_fn(dataset_path, config.train.batch_size, training=False,
                            split=data.eval_split, config=shared)
    return train_fn, eval_fn


def training_order(config, dataset_path, info, group, replicas, *, model_dir, start_step,
                   seed, skip_corrupt=False, restart=False, pipeline="tfdata"):
    """``(decision, refusal, cache_decided)``: where the training input of
    a run at ``start_step`` starts (an :class:`~estimator_keras.order_state.Decision`),
    the :class:`~estimator_keras.order_state.OrderChangedError` that refuses
    it (None: none), and the cache decision of cache="auto" (None: decided
    in the pipeline). A resumed cache="auto" keeps its stored decision."""
    data, train = config.data, config.train
    resolved = records.resolve(dataset_path, data.train_split, check_sizes=False)
    shared = input_config(config, skip_corrupt, seed)
    if info.has_ps:
        # Parameter-server workers split the files between chief and workers.
        pipelines, per_step = len(info.cluster.get("chief", []) + info.cluster.get("worker", [])), 1
    else:
        pipelines = (group.input_shard[0] if group.input_shard else
                     info.num_workers if info.num_workers > 1 else 1)
        per_step = max(1, replicas // pipelines)
    names = set(feature_map(resolved.schema, data.features, data.label).values())
    if pipeline == "grain":
        cache, reason = False, "the Grain pipeline reads records by index: no cache"
    else:
        cache, reason = input_config_lib.cache_decision(
            shared, resolved, names | {data.label} - {None}, pipelines)
    # A run with nothing left to train reads no order: evaluate and export
    # need none, and an unreadable file must not stand in their way.
    finished = train.max_steps is not None and start_step >= train.max_steps
    stored = order_state.stored_cache(model_dir, start_step, pipeline) \
        if data.cache == "auto" and not finished and pipeline != "grain" else None
    if stored is not None:
        now = reason.split(": ", 1)[-1]
        reason = (f"cache=auto: {'caching' if stored else 'not caching'} the training input, as "
                  f"decided when its stored order began ({order_state.FILE}); from the memory "
                  f"available now: {now}")
        cache = stored
    settings = order_state.Settings(
        seed=seed, batch_size=train.batch_size,
        global_batch_size=train.batch_size * (1 if info.has_ps else replicas),
        batches_per_step=per_step, asynchronous=bool(info.has_ps),
        pipelines=order_state.pipelines(resolved, pipelines, train.batch_size), cache=bool(cache),
        shuffle=shared.shuffle, shuffle_buffer=shared.shuffle_buffer,
        cache_shuffle="records" if shared.reforms_batches() else "batches",
        cycle_length=shared.cycle_length, block_length=shared.block_length,
        dataset=order_state.fingerprint(resolved), pipeline=pipeline)
    refusal = None
    try:
        decision = order_state.decide(model_dir, 0 if finished else start_step, settings,
                                      restart=restart, approximate=skip_corrupt,
                                      schedule=schedule(train))
    except order_state.OrderChangedError as e:
        refusal = e
        decision = order_state.Decision(start_step, (start_step * per_step,) * pipelines,
                                        "refused")
    if group.process_0_decides:
        # Only process 0 reads the model dir: every process starts where it says.
        told = np.asarray(group.from_process_0(np.array(
            [refusal is not None, bool(cache), *decision.starts], np.int32)))
        if told[0] and refusal is None:
            refusal = order_state.OrderChangedError(
                "process 0 refuses to resume: the input order's settings changed (see its log).")
        cache = bool(told[1])
        decision = dataclasses.replace(decision, starts=tuple(int(n) for n in told[2:]))
    return decision, refusal, ((cache, reason) if data.cache == "auto" and pipeline != "grain"
                               else None)


def schedule(train):
    """The learning rate a run's steps train under (stored with its order)."""
    return optimizers.Schedule.of(train.learning_rate, train.learning_rate_decay,
                                  train.max_steps)


# Where an experiment maps record features to its model's inputs.
FEATURES_HINT = ("data.features ({model input name: record feature}) in the experiment's "
                 "DataConfig or a --config file")


def _refuse_input(feature, target, expected, spec, dataset_path):
    raise SchemaError(
        f"record feature {feature!r} does not fit {target}: the model "
        f"expects {expected}, the records hold {spec.dtype} shape {list(spec.shape)} "
        f"({spec.encoding}) in {dataset_path}.")


def check_numeric_inputs(config, dataset_path):
    """Fails before any model is built when a model input would get a
    feature of strings."""
    schema = records.resolve(dataset_path, config.data.train_split, check_sizes=False).schema
    mapping = feature_map(schema, config.data.features, config.data.label)
    for input_name, feature in mapping.items():
        if schema[feature].encoding == "bytes":
            _refuse_input(feature, f"model input {input_name!r}", "numbers (or images)",
                          schema[feature], dataset_path)


def check_inputs(model, config, dataset_path):
    """Fails before training when records do not fit the model's inputs,
    with expected and found side by side. A model of one input takes the
    one feature whatever either is called; several inputs are matched to
    the features by name."""
    schema = records.resolve(dataset_path, config.data.train_split, check_sizes=False).schema
    mapping = feature_map(schema, config.data.features, config.data.label)
    bound = model_inputs.check_feature_keys(model, mapping, hint=FEATURES_HINT)
    for input_name, tensor in zip(model_inputs.input_names(model), model.inputs):
        feature = mapping[bound[input_name]]
        spec = schema[feature]
        expected = tuple(tensor.shape[1:])
        if spec.encoding in ("bytes",) or tuple(spec.shape) != expected:
            # Keras' own name for an unnamed Input would tell a reader nothing.
            target = "the model's input" if len(bound) == 1 else f"model input {input_name!r}"
            _refuse_input(feature, target, f"shape {list(expected)} (numeric)", spec,
                          dataset_path)
    return schema, mapping


@dataclasses.dataclass(frozen=True)
class RunContext:
    """A run's decisions, made once by :meth:`build`; frozen: every field is
    known when it is built.

    Attributes:
      experiment, config: what to train (config with overrides applied).
      info: this task (:class:`~estimator_keras.distribute.tf_config.ClusterInfo`).
      engine: the :class:`~estimator_keras.engines.base.Engine`.
      strategy_name, distribute, replicas: the distribution strategy.
      model_dir, export_dir, tensorboard_dir: where things go (export_dir
        None: MODEL_DIR/export; tensorboard_dir None: MODEL_DIR).
      dataset_path: the prepared dataset directory.
      train_fn, eval_fn: the input functions (their ``files`` say what they read).
      probe: one uncompiled model, built to check the records and checkpoints.
      skip_corrupt: drop unreadable records instead of stopping.
      start_step: the step of the model dir's checkpoint when the run starts.
      seed: the run's random seed (train.seed), the same after a resume.
      policy, policy_reason: the Keras mixed-precision policy the model computes
        in, and why (see :func:`estimator_keras.precision.resolve`).
      preemption_grace: seconds from SIGTERM to the end of the process.
      data: the dataset's :class:`~experiments.config.data_info.DataInfo`.
      flat_export: the final export in Vertex's layout (SavedModel at the root).
      hypertune_metric: a tuning trial's metric, reported to Vertex at the end.
      evaluations: where each evaluation is recorded as it happens (an
        :class:`experiments.tuning.evaluations.Recorder`; None: nowhere).
      changed: the model or data settings this run changes in a model dir
        with checkpoints (see :mod:`experiments.config.files`).
      tracking_uri: where the chief records the run in MLflow (None: nowhere;
        see :mod:`experiments.training.tracked`).
      register: the MLflow registered model the final export becomes a version of.
      order: where the training input starts, and the order the chief
        stores (an :class:`~estimator_keras.order_state.Decision`).
      order_refusal: the error that refuses a rerun whose input order
        settings changed, raised before training (None: none).
    """

    experiment: object
    config: object
    info: object
    engine: object
    strategy_name: str
    distribute: object
    replicas: int
    model_dir: str
    export_dir: str
    tensorboard_dir: str
    dataset_path: str
    train_fn: object
    eval_fn: object
    probe: object
    skip_corrupt: bool
    start_step: int = 0
    seed: int = None
    policy: str = None
    policy_reason: str = None
    preemption_grace: float = DEFAULT_GRACE_SECS
    data: object = None
    flat_export: bool = False
    hypertune_metric: str = None
    evaluations: object = None
    changed: list = dataclasses.field(default_factory=list)
    tracking_uri: str = None
    register: str = None
    order: object = None
    order_refusal: object = None

    @classmethod
    def build(cls, experiment, config, *, model_dir, data_dir, source_dir=None,
              strategy="auto", engine="auto", skip_corrupt=False, prepare_workers=1,
              export_dir=None, tensorboard_dir=None, preemption_grace=DEFAULT_GRACE_SECS,
              flat_export=False, hypertune_metric=None, evaluations=None, track=None,
              register=None, restart_order=False):
        # A TrainJob pod on the TensorFlow runtime gets its TF_CONFIG here,
        # before anything reads it.
        trainjob_pods.export_tf_config()
        tracking_uri = tracking_settings.resolve(track)
        if register and not tracking_uri:
            raise ConfigError(f"--register {register} registers the export in MLflow's model "
                              f"registry: give --track URI (or set "
                              f"{tracking_settings.URI_VARIABLE}) too.")
        entry = registry.get(engine_for(engine, model_dir))
        # The entry answers which strategy this task trains with: TF_CONFIG,
        # or the processes the engine trains with outside TensorFlow. Strategy
        # first: MultiWorkerMirroredStrategy must precede any eager op.
        info, group, strategy_name = entry.choose_strategy(strategy)
        distribute = (group.distribution() if group is not None else
                      strategy_lib.make_train_distribute(strategy_name, cluster_info=info))
        # Only now: importing an engine loads Keras.
        engine_obj = engines.get_engine(entry.name)
        replicas = strategy_lib.num_replicas(distribute)
        training_group = groups.of(distribute)
        backend, platform, devices = engines.backend_devices(engine_obj.name)
        pipeline, _ = choose_pipeline(config, entry, backend)
        task_log(info, header_line(config, strategy_name, replicas, info, engine_obj.name,
                                   training_group.description,
                                   f"{backend}, {describe_devices(platform, devices)}",
                                   pipeline))
        if skip_corrupt and pipeline == "grain":
            # Refused before the data is touched or anything is written.
            instead = ("train with --hparams pipeline=tfdata to skip them, or "
                       if pipeline_choice.tensorflow_installed() else "")
            raise ConfigError(
                f"--skip-corrupt drops the records tf.data cannot read, and this run reads "
                f"through the Grain pipeline, which reads records by index and stops at a "
                f"damaged one, naming it: {instead}rewrite the damaged shards (python -m "
                f"experiments inspect --verify names them).")
        dataset_path = ensure_data(config, data_dir, source_dir,
                                   is_chief=info.is_chief, num_workers=prepare_workers)
        check_numeric_inputs(config, dataset_path)
        data = data_info.describe(manifest.load_manifest(dataset_path), config.data)
        changed = config_files.changed_settings(model_dir, config, dataset_path, data)
        latest = engine_obj.latest_checkpoint(str(model_dir))
        start_step = (engine_obj.checkpoint_step(latest) or 0) if latest else 0
        if training_group.process_0_decides:
            # A group starts where process 0's model dir says, whatever the
            # others see: they all train, or none does.
            start_step = int(training_group.from_process_0(start_step))
        if config.train.deterministic and keras_setup.tensorflow_installed():
            # TensorFlow's ops (tf.data's among them); JAX on CPU always is.
            import tensorflow as tf  # pylint: disable=import-outside-toplevel
            tf.config.experimental.enable_op_determinism()
        # The same seed however often the run was stopped: every epoch's
        # input order is a function of it and the epoch.
        seed = config.train.seed
        if seed is not None:
            engines.keras_api().utils.set_random_seed(seed)
        probe = experiment.make_model(config.model, data)
        refuses = entry.no_bfloat16
        policy, policy_reason = precision.resolve(
            config.train.precision,
            no_bfloat16=refuses(strategy_name, probe) if refuses else "")
        if config.train.precision != "float32":
            task_log(info, f"precision {policy} ({config.train.precision}: {policy_reason}); "
                           f"variables and exports stay float32")
        source = f"experiment {config.name}'s model builder"
        engines.check_model_keras(probe, engine_obj.name, source=source)
        engine_obj.check_model(probe, source)
        check_inputs(probe, config, dataset_path)
        losses.check_logits(probe, config.loss)
        slow = engines.setup_warning(engine_obj.name, backend, platform, probe, info.num_workers)
        if slow and info.is_chief:
            task_log(info, slow)
        restarted = config.train.deterministic and engine_obj.random_layers_restarted(probe)
        if restarted and info.is_chief:
            task_log(info, f"--deterministic: the {engine_obj.name} engine's checkpoints do not "
                           f"keep the random layers' state; {', '.join(restarted)}: their draws "
                           f"(dropout masks) start over after a resume, so a resumed run is "
                           f"not bit-identical to one never stopped")
        order, order_refusal, cache_decided = training_order(
            config, dataset_path, info, training_group, replicas, model_dir=str(model_dir),
            start_step=start_step, seed=seed, skip_corrupt=skip_corrupt, restart=restart_order,
            pipeline=pipeline)
        train_fn, eval_fn = input_fns(config, dataset_path, info, skip_corrupt, seed,
                                      shard=training_group.input_shard, start_step=start_step,
                                      resume=order, cache_decided=cache_decided,
                                      pipeline=pipeline)
        return cls(experiment=experiment, config=config, info=info, engine=engine_obj,
                   strategy_name=strategy_name, distribute=distribute, replicas=replicas,
                   model_dir=str(model_dir), export_dir=export_dir,
                   tensorboard_dir=tensorboard_dir, dataset_path=dataset_path,
                   train_fn=train_fn, eval_fn=eval_fn, probe=probe, skip_corrupt=skip_corrupt,
                   start_step=start_step, seed=seed, policy=policy, policy_reason=policy_reason,
                   preemption_grace=preemption_grace, data=data, flat_export=flat_export,
                   hypertune_metric=hypertune_metric, evaluations=evaluations,
                   changed=changed, tracking_uri=tracking_uri, register=register,
                   order=order, order_refusal=order_refusal)

    @property
    def group(self):
        """What training runs under, as a
        :class:`~estimator_keras.distribute.groups.TrainingGroup`."""
        return groups.of(self.distribute)

    def log(self, message):
        task_log(self.info, message)

    def log_resume(self):
        """Refuses a rerun whose input order changed (before anything is
        written), or logs where its training input picks up, and where its
        cosine decay now ends if not where its checkpoint's did."""
        if not self.start_step or self.start_step >= self.config.train.max_steps:
            return
        self.check_order()
        if self.order is not None and self.order.message:
            self.log(self.order.message)
        trained = self.order and self.order.trained_schedule
        now = schedule(self.config.train)
        if (trained is not None and trained.decay != now.decay
                and not self.engine.resumes_across_decays):
            raise ConfigError(
                f"learning_rate_decay: the checkpoint of step {self.start_step} in "
                f"{self.model_dir} was trained under {optimizers.describe(trained)}, and this "
                f"run asks for {optimizers.describe(now)}: the {self.engine.name} engine's "
                f"checkpoints hold the optimizer's variables, which differ between a "
                f"constant rate and a decay, so its checkpoint cannot continue under another "
                f"decay. Keep learning_rate_decay={trained.decay} to resume, or train under "
                f"{now.decay} into a new --model-dir.")
        changed = optimizers.schedule_changed(trained, now, self.start_step)
        if changed:
            self.log(changed)

    def check_order(self):
        """Raises the refusal of a rerun that would train on in a changed input order."""
        if self.order_refusal is not None and self.start_step < self.config.train.max_steps:
            raise self.order_refusal

    def store_order(self):
        """The chief stores the input order it trains, before a step of it."""
        if self.order is not None and self.start_step < self.config.train.max_steps:
            self.order.store(self.model_dir)

    def build_model(self):
        return self.experiment.make_model(self.config.model, self.data)

    @property
    def schema(self):
        return self.train_fn.files.schema

    def plan(self, hooks, preemption=None):
        """The engine's :class:`~estimator_keras.engines.base.TrainingPlan`."""
        config, train = self.config, self.config.train
        early = None
        if train.early_stopping_steps:
            early = base.EarlyStopping(config.best_metric, train.early_stopping_steps,
                                       config.higher_is_better)
        return experiment_plan(
            self.experiment, config, self.data, model_dir=self.model_dir, train_data=self.train_fn,
            eval_data=self.eval_fn, replicas=self.replicas, early_stopping=early,
            strategy=self.distribute, hooks=hooks, seed=self.seed, preemption=preemption,
            policy=self.policy, chief=self.info.is_chief,
            summary_dir=self.tensorboard_dir)


def experiment_plan(experiment, config, data=None, policy=None, **fields):
    """A :class:`~estimator_keras.engines.base.TrainingPlan` for an experiment's
    model (built for ``data``, a DataInfo, computing in ``policy``: by default
    what ``config.train.precision`` resolves to) and training settings;
    ``fields`` set the rest (model_dir, input functions...)."""
    train = config.train
    if policy is None:
        policy, _ = precision.resolve(train.precision)
    fields.setdefault("model_dir", "")
    fields.setdefault("train_data", None)
    fields.setdefault("eval_data", None)
    fields.setdefault("seed", train.seed)
    return base.TrainingPlan(
        build_model=precision.with_policy(lambda: experiment.make_model(config.model, data),
                                          policy), loss=config.loss,
        metrics=lambda: experiment.make_metrics(data), max_steps=train.max_steps,
        eval_every_steps=train.eval_every_steps, optimizer=train.optimizer,
        learning_rate=optimizers.learning_rate(train.learning_rate, train.learning_rate_decay,
                                               train.max_steps),
        batch_size=train.batch_size,
        log_every_steps=train.log_every_steps, keep_checkpoint_max=train.keep_checkpoint_max,
        **fields)
