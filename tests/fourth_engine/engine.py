"""The fourth engine's Engine: a ``tf.GradientTape`` loop of its own over
the package's input pipeline (no built-in engine's code), writing
TensorFlow checkpoints of its own layout (``fourth.ckpt-N``: the model, the
optimizer and ``fourth_engine_step``) and exports of its own (the model in
its Keras' own file format, and ``export.json``)."""

import json

import tensorflow as tf

from estimator_keras import export as export_lib, io, model_inputs
from estimator_keras.engines import base, model_dirs, optimizers
from estimator_keras.errors import ModelDirError
from fourth_engine import CHECKPOINT_NAME, KERAS, NAME, STEP_KEY, claims

# Keras 3 saves a whole model as .keras, Keras 2 as .h5 (no custom objects needed).
MODEL_FILE = "model.keras" if KERAS == 3 else "model.h5"


class _Run:
    """A model, its optimizer and step, and their checkpoint."""

    def __init__(self, plan, model_dir):
        self.model = plan.build_model()
        make = optimizers.keras3_optimizer if KERAS == 3 else optimizers.keras_optimizer
        self.optimizer = make(plan.optimizer, plan.learning_rate)
        if hasattr(self.optimizer, "build"):  # a legacy optimizer makes its slots as it steps
            self.optimizer.build(self.model.trainable_variables)
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.checkpoint = tf.train.Checkpoint(model=self.model, optimizer=self.optimizer,
                                              fourth_engine_step=self.step)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, model_dir, max_to_keep=plan.keep_checkpoint_max,
            checkpoint_name=CHECKPOINT_NAME)

    def restore(self, checkpoint):
        self.checkpoint.restore(checkpoint).assert_existing_objects_matched()
        return int(self.step.numpy())

    def save(self):
        return self.manager.save(checkpoint_number=int(self.step.numpy()))


def _restored_model(model_builder, checkpoint):
    model = model_builder() if callable(model_builder) and not isinstance(
        model_builder, tf.keras.Model) else model_builder
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
    tf.train.Checkpoint(model=model, fourth_engine_step=step).restore(
        checkpoint).expect_partial()
    return model, int(step.numpy())


def _metrics(plan, model, checkpoint_step):
    model.compile(loss=plan.loss, metrics=plan.metrics())
    data = model_inputs.as_model_inputs(model, plan.eval_data(input_context=None))
    metrics = model.evaluate(data, steps=plan.eval_steps, return_dict=True, verbose=0)
    return dict(base.plain_metrics(metrics), global_step=checkpoint_step)


class FourthEngine(base.Engine):
    """Trains one process with its own loop; checkpoints and exports of its own."""

    name = NAME

    def train(self, plan):
        run = _Run(plan, plan.model_dir)
        latest = self.latest_checkpoint(plan.model_dir)
        if latest:
            self.check_can_restore(latest)
            plan.hooks.log(f"resuming from {latest} at step {run.restore(latest)}")
        start = int(run.step.numpy())
        loss_fn = tf.keras.losses.get(plan.loss)
        model, optimizer = run.model, run.optimizer

        @tf.function
        def train_step(features, labels):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(loss_fn(labels, model(features, training=True)))
                loss += sum(model.losses) if model.losses else 0.0
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        data = model_inputs.as_model_inputs(model, base.training_input(plan.train_data, None,
                                                                       start))
        meter = base.ProgressMeter(plan.log_every_steps, plan.batch_size, log=plan.hooks.log,
                                   max_steps=plan.max_steps, on_progress=plan.hooks.on_progress)
        history, metrics, step = [], None, start
        for element in data:
            if step >= plan.max_steps:
                break
            loss = base.finite_loss({"loss": train_step(element[0], element[1])}, step + 1,
                                    lambda: run.manager.latest_checkpoint)
            step = int(run.step.assign_add(1).numpy())
            meter.update(step, loss)
            if plan.preemption is not None and plan.preemption.requested:
                run.save()
                raise plan.preemption.stopped(step)
            if step % plan.eval_every_steps == 0 or step >= plan.max_steps:
                saved = run.save()
                metrics = _metrics(plan, model, step)
                metrics.pop("global_step")
                if base.record_evaluation(plan.hooks, step, metrics, saved, plan.chief,
                                          plan.early_stopping, history):
                    break
        meter.finish(step)
        return base.RunResult(model=model, metrics=dict(metrics or {}, global_step=step),
                              global_step=step, checkpoint=None)

    def evaluate(self, plan, checkpoint):
        model, step = _restored_model(plan.build_model, checkpoint)
        return _metrics(plan, model, step)

    def latest_checkpoint(self, model_dir):
        model_dirs.check_can_continue(model_dir, self.name)
        return tf.train.latest_checkpoint(str(model_dir))

    def checkpoint_step(self, checkpoint):
        reader = tf.train.load_checkpoint(checkpoint)
        return int(reader.get_tensor(STEP_KEY)) if reader.has_tensor(STEP_KEY) else None

    def check_can_restore(self, checkpoint):
        if not claims(tf.train.load_checkpoint(checkpoint)):
            raise ModelDirError(f"{checkpoint} was not written by the {NAME} engine, which "
                                f"continues only its own checkpoints; use a new --model-dir.")

    def check_compatible(self, model, checkpoint):
        """Every weight of ``model`` restores from the checkpoint, in its shape."""
        try:
            tf.train.Checkpoint(model=model).restore(
                checkpoint).assert_existing_objects_matched().expect_partial()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            raise ModelDirError(f"{checkpoint} does not fit the model: {e}") from e

    def export(self, model_builder, model_dir, *, checkpoint, schema=None, features=None,
               export_dir=None, metadata=None, class_names=None, flat=False,
               output_activation=None):
        del schema, features, flat  # no serving signatures: a test engine's own export
        checkpoint = checkpoint or self.require_checkpoint(model_dir)
        model, step = _restored_model(model_builder, checkpoint)
        export_dir = export_dir or io.join(model_dir, export_lib.EXPORT_DIR)

        def write(staging):
            model.save(io.join(staging, MODEL_FILE))
            info = {"checkpoint": checkpoint, "global_step": step, "model": MODEL_FILE,
                    **(metadata or {})}
            if class_names:
                info["class_names"] = [str(n) for n in class_names]
            if output_activation:
                info["output_activation"] = output_activation
            io.atomic_write(io.join(staging, export_lib.EXPORT_INFO),
                            json.dumps(info, indent=2, default=str))

        return export_lib.write_staged(export_dir, write)

    def export_if_best(self, model_builder, model_dir, checkpoint, metrics, metric,
                       higher_is_better=True, **options):
        return export_lib.export_if_best(model_builder, model_dir, checkpoint, metrics, metric,
                                         higher_is_better, exporter=self.export, **options)
