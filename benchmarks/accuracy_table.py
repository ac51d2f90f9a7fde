"""Table "accuracy" (slow): does the fast pipeline train as well, and as fast?

The ``fashion_mnist_cnn`` experiment (seed CNN, Adam 1e-3 legacy, batch
128, 6000 steps, seed 42) is trained four ways, in chunks of
``eval_every`` steps that alternate between the runs (so machine
drift hits all of them alike), with a full test-set evaluation after every
chunk:

- ``estimator_default``: the experiments' path (``experiments.train``'s
  compiled model, ``input_fns`` and ``run_config``; ``est.train`` to the
  chunk's step, ``est.evaluate`` on the test split): shuffle="batch";
- ``keras_fit_numpy``: the same compiled model, ``Model.fit`` on numpy
  arrays (``steps_per_epoch=eval_every``), ``Model.evaluate`` on the test
  arrays;
- ``estimator_record_shuffle``: as the first, with a full record-level
  shuffle (shuffle="record", shuffle_buffer=10000);
- ``estimator_cached_epoch``: as the first, with the input cached after one
  epoch (``make_dataset(num_epochs=1, cache=True).repeat()``), the pipeline
  that removes the input cost for small models (see the inputbound table).

Each Estimator chunk runs with graph seed ``42 + chunk``: with one fixed
graph seed every restarted ``est.train`` replays the first chunk's input
order and dropout masks (a first run without this trailed Keras by ~1.5
points at 4000 steps; see BENCHMARKS.md).

Training time counts the intervals between consecutive step ends inside a
chunk (the first 5 steps of a chunk, graph building and evaluations are
excluded); wall time counts everything.
"""

import dataclasses
import os
import time

from benchmarks import common, training_table
from benchmarks.common import IMAGE, LABEL

TABLE = "accuracy"
TITLE = "fashion_mnist_cnn: accuracy, time to 0.90, steps/s (Estimator vs Keras fit)"
EXPERIMENT = "fashion_mnist_cnn"
TARGET_ACCURACY = 0.90
ISSUE3_ACCURACY = 0.91


@dataclasses.dataclass
class Chunk:
    step: int
    accuracy: float
    loss: float
    train_s: float
    intervals: int
    wall_s: float
    eval_s: float


class _Run:
    """One training run, advanced chunk by chunk."""

    def __init__(self, name, description):
        self.name, self.description = name, description
        self.chunks = []
        self.setup_s = 0.0

    def advance(self, step):
        raise NotImplementedError

    def summary(self):
        chunks = self.chunks
        train_s = sum(c.train_s for c in chunks)
        intervals = sum(c.intervals for c in chunks)
        row = {"name": self.name, "description": self.description,
               "steps": chunks[-1].step if chunks else 0,
               "final_accuracy": chunks[-1].accuracy if chunks else None,
               "best_accuracy": max(c.accuracy for c in chunks) if chunks else None,
               "steps_per_s": intervals / train_s if train_s else None,
               "train_s": train_s,
               "wall_s": self.setup_s + sum(c.wall_s + c.eval_s for c in chunks),
               "curve": [dataclasses.asdict(c) for c in chunks]}
        cum_train = cum_wall = 0.0
        row.update({"step_090": None, "t090_train_s": None, "t090_wall_s": None})
        cum_wall = self.setup_s
        for c in chunks:
            cum_train += c.train_s
            cum_wall += c.wall_s
            if c.accuracy >= TARGET_ACCURACY:
                row.update({"step_090": c.step, "t090_train_s": cum_train,
                            "t090_wall_s": cum_wall})
                break
            cum_wall += c.eval_s
        return row


WARM_STEPS = 5


def _intervals(times):
    """(intervals, seconds) between consecutive step ends, leaving out the
    first few steps of a chunk (graph optimisation and pipeline fill after a
    rebuild, which a single long run would pay once)."""
    times = times[min(WARM_STEPS, len(times) // 4):]
    if len(times) < 2:
        return 0, 0.0
    return len(times) - 1, times[-1] - times[0]


class EstimatorRun(_Run):
    def __init__(self, name, description, experiment, config, path, workdir, eval_every,
                 train_fn=None):
        super().__init__(name, description)
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        from estimator_keras.engines import estimator as est_lib  # pylint: disable=import-outside-toplevel
        from experiments import context  # pylint: disable=import-outside-toplevel

        start = time.perf_counter()
        tf.keras.utils.set_random_seed(config.train.seed)
        model = est_lib.compile_for_estimator(context.experiment_plan(experiment, config))
        self.train_fn, self.eval_fn = context.input_fns(config, path)
        if train_fn is not None:
            self.train_fn = train_fn
        model_dir = os.path.join(workdir, "accuracy", name)
        self.seed = config.train.seed
        self.estimator = est_lib.to_estimator(model, config=est_lib.run_config(
            model_dir, save_checkpoints_steps=eval_every,
            keep_checkpoint_max=config.train.keep_checkpoint_max,
            log_every_steps=config.train.log_every_steps, seed=self.seed))
        self.setup_s = time.perf_counter() - start

    def _estimator_for_chunk(self):
        """The Estimator for the next chunk, with graph seed ``seed + chunk``.

        Each ``est.train`` builds a new graph; with the same graph-level seed
        every chunk would replay the first chunk's input order (tf.data
        shuffles take their seeds from it) and dropout masks. One long
        ``est.train`` (what train_and_evaluate runs) never restarts, so
        reseeding per chunk is what stands in for it here.
        """
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        k = len(self.chunks)
        if k == 0:
            return self.estimator
        base = self.estimator
        return tf.estimator.Estimator(
            model_fn=base._model_fn,  # pylint: disable=protected-access
            config=base.config.replace(tf_random_seed=self.seed + k))

    def advance(self, step):
        times = []
        start = time.perf_counter()
        estimator = self._estimator_for_chunk()
        estimator.train(self.train_fn, max_steps=step,
                        hooks=[training_table.timing_hook(times)])
        wall = time.perf_counter() - start
        start = time.perf_counter()
        metrics = estimator.evaluate(self.eval_fn)
        eval_s = time.perf_counter() - start
        n, seconds = _intervals(times)
        self.chunks.append(Chunk(int(metrics["global_step"]), float(metrics["accuracy"]),
                                 float(metrics["loss"]), seconds, n, wall, eval_s))


class KerasRun(_Run):
    def __init__(self, name, description, experiment, config, arrays, test_arrays, eval_every):
        super().__init__(name, description)
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        from estimator_keras.engines import estimator as est_lib  # pylint: disable=import-outside-toplevel
        from experiments import context  # pylint: disable=import-outside-toplevel

        start = time.perf_counter()
        self.experiment, self.config = experiment, config
        self._restore_classes()
        tf.keras.utils.set_random_seed(config.train.seed)
        self.model = est_lib.compile_for_estimator(context.experiment_plan(experiment, config))
        self.arrays, self.test_arrays, self.eval_every = arrays, test_arrays, eval_every
        self.epoch = 0
        self.setup_s = time.perf_counter() - start

    def _restore_classes(self):
        # See training_table.restore_v2_layer_classes: Estimator chunks in the
        # same process swap Keras's layer classes to v1.
        self.experiment.build_model(self.config.model)

    def advance(self, step):
        times = []
        done = self.chunks[-1].step if self.chunks else 0
        start = time.perf_counter()
        self._restore_classes()
        x, y = self.arrays
        self.epoch = training_table.fit_numpy_steps(
            self.model, x, y, self.config.train.batch_size, step - done, self.epoch,
            callbacks=[training_table.KerasTimer(times)])
        wall = time.perf_counter() - start
        start = time.perf_counter()
        tx, ty = self.test_arrays
        loss, accuracy = self.model.evaluate(tx, ty, batch_size=self.config.train.batch_size,
                                             verbose=0)
        eval_s = time.perf_counter() - start
        n, seconds = _intervals(times)
        if len(times) != step - done:
            raise RuntimeError(f"Keras ran {len(times)} steps instead of {step - done}")
        self.chunks.append(Chunk(step, float(accuracy), float(loss), seconds, n, wall, eval_s))


def _cached_input_fn(path, batch_size):
    from benchmarks import input_table  # pylint: disable=import-outside-toplevel

    def input_fn():
        return input_table.cached_epoch_pipeline(path, batch_size)
    return input_fn


def run(settings, path=None, steps=None, eval_every=None):
    """Runs the table; ``steps`` defaults to the experiment's max_steps (300
    with --quick), ``eval_every`` to 500 (100 with --quick)."""
    common.quiet_tensorflow()
    from experiments import catalog, registry  # pylint: disable=import-outside-toplevel

    catalog.load()
    path = path or common.dataset_path(settings)
    experiment = registry.get(EXPERIMENT)
    config = experiment.config
    steps = int(steps or (300 if settings.quick else config.train.max_steps))
    eval_every = int(eval_every or (100 if settings.quick else 500))
    eval_every = min(eval_every, steps)
    record_config = dataclasses.replace(config, data=dataclasses.replace(
        config.data, shuffle="record", shuffle_buffer=10000))
    arrays = common.load_arrays(path, "train")
    test_arrays = common.load_arrays(path, "test")
    load_start = common.load_average()
    runs = [
        EstimatorRun("estimator_default", "experiments' Estimator path, shuffle=batch "
                     "(default)", experiment, config, path, settings.workdir, eval_every),
        KerasRun("keras_fit_numpy", "Keras Model.fit on numpy arrays, same compiled model",
                 experiment, config, arrays, test_arrays, eval_every),
        EstimatorRun("estimator_record_shuffle", "Estimator path with shuffle=record, "
                     "shuffle_buffer=10000", experiment, record_config, path,
                     settings.workdir, eval_every),
        EstimatorRun("estimator_cached_epoch", "Estimator path, input_fn = make_dataset("
                     "num_epochs=1, cache=True).repeat(): the same batches every epoch, "
                     "in a new order", experiment, config, path, settings.workdir, eval_every,
                     train_fn=_cached_input_fn(path, config.train.batch_size)),
    ]
    targets_steps = list(range(eval_every, steps + 1, eval_every))
    if targets_steps[-1] != steps:
        targets_steps.append(steps)
    for k, step in enumerate(targets_steps):
        for r in runs[k % len(runs):] + runs[:k % len(runs)]:
            r.advance(step)
            c = r.chunks[-1]
            common.say(f"[{TABLE}] {r.name}: step {c.step} accuracy {c.accuracy:.4f} "
                       f"({c.intervals / c.train_s if c.train_s else 0:.2f} steps/s)")
    rows = [r.summary() for r in runs]
    by = {r["name"]: r for r in rows}
    est, keras, rec = by["estimator_default"], by["keras_fit_numpy"], by["estimator_record_shuffle"]
    cached = by["estimator_cached_epoch"]
    for row in rows:
        row["ratio"] = common.ratio(row["steps_per_s"], keras["steps_per_s"])

    def diff(a, b):
        return None if a is None or b is None else a - b

    gap = diff(est["final_accuracy"], rec["final_accuracy"])
    targets = [
        common.target("accuracy.default_vs_record_shuffle",
                      "|final accuracy shuffle=batch - shuffle=record(10000)|, points",
                      None if gap is None else abs(gap) * 100, 0.3, op="<="),
        common.target("accuracy.cached_vs_default",
                      "final accuracy cached-epoch pipeline - default, points (info)",
                      None if diff(cached["final_accuracy"], est["final_accuracy"]) is None
                      else diff(cached["final_accuracy"], est["final_accuracy"]) * 100, -0.3),
        common.target("accuracy.issue3_default",
                      f"estimator default final test accuracy after {steps} steps",
                      est["final_accuracy"], ISSUE3_ACCURACY),
        common.target("accuracy.issue3_vs_keras_accuracy",
                      "estimator final accuracy - Keras fit final accuracy",
                      diff(est["final_accuracy"], keras["final_accuracy"]), 0.0),
        common.target("accuracy.issue3_vs_keras_speed",
                      "estimator steps/s / Keras fit steps/s",
                      common.ratio(est["steps_per_s"], keras["steps_per_s"]), 1.0),
        common.target("accuracy.time_to_090",
                      "Keras fit / estimator training seconds to 0.90 (info: >= 1 means "
                      "the Estimator got there first)",
                      common.ratio(keras["t090_train_s"], est["t090_train_s"]), 1.0),
    ]
    return {"table": TABLE, "title": TITLE, "unit": "", "rows": rows,
            "columns": ["name", "steps", "final_accuracy", "best_accuracy", "steps_per_s",
                        "ratio", "train_s", "wall_s", "step_090", "t090_train_s",
                        "t090_wall_s"],
            "targets": targets, "steps": steps, "eval_every": eval_every,
            "batch_size": config.train.batch_size,
            "learning_rate": config.train.learning_rate, "dataset": path,
            "load_before": load_start, "load_after": common.load_average(),
            "notes": ["ratio = steps/s / Keras fit steps/s",
                      "steps/s and train_s count step-to-step intervals inside chunks "
                      "(first 5 steps of each chunk left out); "
                      "wall_s adds setup, graph builds, checkpoints and evaluations",
                      "one run per way (seed 42): accuracies carry run-to-run noise of a "
                      "few tenths of a point"]}
