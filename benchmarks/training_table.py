"""Table "training": steady-state steps/s of the seed CNN and seed MLP.

Each way of training the same model (same layers, Adam 1e-3, sparse
cross-entropy, batch 128) is timed in windows: a window runs ``warm``
untimed steps (graph optimisation, pipeline fill) and then ``steps`` timed
ones, measured from the end of step ``warm`` to the end of the last step by
a SessionRunHook (Estimator) or a Keras callback (``fit``) or around the
``session.run`` loop (v1 loops). Graph building, session creation and
checkpoint restore between windows are outside the timing.

Ways compared:

- ``estimator``: this package's ``to_estimator`` + ``make_input_fn`` with the
  experiments' input settings (``cache="auto"``, which caches Fashion-MNIST;
  every window starts a new, empty cache: the MLP's windows fill it in one
  extra epoch of untimed warm-up steps, the CNN's time the fill),
  ``est.train``; also with the library's default ``cache=False`` and with
  session thread settings;
- ``fit_numpy``: Keras ``Model.fit`` on in-memory numpy arrays;
- ``fit_dataset``: Keras ``Model.fit`` on this package's ``make_dataset``;
- ``queue_runners``: Keras layers in a v1 graph on ``shuffle_batch``
  tensors (32 threads, as in the seed answer), a ``session.run(train_op)`` loop;
- ``feed_dict``: the seed question's loop, numpy batches fed to placeholders.
"""

import math
import os
import time

from benchmarks import common, legacy, output
from benchmarks.common import IMAGE, LABEL, Variant

TABLE = "training"
TITLE = "training steps/s (batch 128), steady state"
MODELS = ("seed_cnn", "seed_mlp")
LEARNING_RATE = 1e-3
# (name suffix, inter_op, intra_op): session thread settings tried on the Estimator.
THREADS = [("inter=1,intra=2", 1, 2), ("inter=2,intra=1", 2, 1), ("inter=1,intra=1", 1, 1)]


def build_fn(model_name):
    from experiments.catalog import models  # pylint: disable=import-outside-toplevel
    return getattr(models, model_name)


def compiled(model_name, seed=0):
    """The model compiled as the experiments compile it."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    from estimator_keras.engines.optimizers import legacy_optimizer  # pylint: disable=import-outside-toplevel

    tf.keras.utils.set_random_seed(seed)
    model = build_fn(model_name)({})
    model.compile(optimizer=legacy_optimizer("adam", LEARNING_RATE),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def session_config(inter=None, intra=None):
    if inter is None and intra is None:
        return None
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf.compat.v1.ConfigProto(inter_op_parallelism_threads=inter or 0,
                                    intra_op_parallelism_threads=intra or 0,
                                    allow_soft_placement=True)


def warm_steps(model_name):
    return 5 if model_name == "seed_cnn" else 30


class _StepWindow(Variant):
    """Sizing shared by every training variant: the window holds
    ``2 * window_s`` seconds of steps (at least 20)."""

    def __init__(self, name, model_name, settings, description="", group="baseline"):
        self.name, self.model_name, self.settings = name, model_name, settings
        self.description, self.group = description, group
        self.warm = warm_steps(model_name)
        self.steps = 20

    def _run(self, steps):
        """Runs warm + steps steps; returns (steps, seconds of the timed part)."""
        raise NotImplementedError

    def warmup(self):
        count, seconds = self._run(self.steps)
        self.steps = common.window_size(count / max(seconds, 1e-9),
                                        2 * self.settings.window_s, 20, 5000)

    def measure(self):
        return self._run(self.steps)

    def extra(self):
        return {"window_steps": self.steps, "model": self.model_name}


def timing_hook(times):
    """A SessionRunHook appending time.perf_counter() after every step."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    class _Hook(tf.estimator.SessionRunHook):
        def after_run(self, run_context, run_values):
            times.append(time.perf_counter())

    return _Hook()


def timed_part(times, warm):
    """(steps, seconds) from the end of step ``warm`` to the last step."""
    steps = len(times) - warm
    return steps, times[-1] - times[warm - 1]


class EstimatorVariant(_StepWindow):
    """``to_estimator(model)`` trained by ``est.train`` on ``input_fn``."""

    consumed = "est.train(input_fn), SessionRunHook timing"

    def __init__(self, name, model_name, settings, input_fn_factory, config=None,
                 description="", group="baseline", fill_steps=0):
        super().__init__(name, model_name, settings, description, group)
        self.input_fn_factory = input_fn_factory
        self.config = config
        # Every window builds a new graph and so a new, empty cache: it fills
        # during these extra untimed steps.
        self.warm += fill_steps

    def build(self):
        from estimator_keras.engines.estimator import engine as est_lib  # pylint: disable=import-outside-toplevel

        model_dir = os.path.join(self.settings.workdir, "training",
                                 f"{self.model_name}-{self.name}".replace(" ", "_")
                                 .replace("=", "").replace(",", "_"))
        self.estimator = est_lib.to_estimator(
            compiled(self.model_name, self.settings.seed), model_dir=model_dir,
            session_config=self.config, seed=self.settings.seed)
        self.input_fn = self.input_fn_factory()

    def _run(self, steps):
        times = []
        self.estimator.train(self.input_fn, steps=self.warm + steps,
                             hooks=[timing_hook(times)])
        return timed_part(times, self.warm)


class KerasTimer:
    def __new__(cls, times):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        class _Timer(tf.keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                times.append(time.perf_counter())

        return _Timer()


def restore_v2_layer_classes(model_name):
    """Makes Keras's layer classes v2 again before eager Keras use.

    Keras 2 swaps the base class of every layer class to its v1 version when
    a layer is built in a v1 graph (``model_to_estimator``'s model_fn, the
    queue-runner graph) and back when one is built eagerly; a model built
    eagerly fails ("invalid state") while the classes are swapped to v1.
    Building a throwaway copy of the same architecture eagerly swaps them
    back, so eager and graph-mode variants can alternate in one process.
    """
    build_fn(model_name)({})


def fit_numpy_steps(model, x, y, batch_size, steps, initial_epoch=0, callbacks=()):
    """``model.fit`` on numpy arrays for exactly ``steps`` steps; returns the
    epoch to start the next call from.

    Keras stops an epoch that runs past the end of the arrays ("ran out of
    data"), and Keras 3 starts the arrays afresh only once a pass is used
    up: its epochs of ``steps_per_epoch`` steps go on where the last one
    stopped. So the steps are whole passes, one epoch each, then one more
    ``fit`` call for the rest, shorter than a pass, on a fresh pass.
    """
    per_pass = -(-len(y) // batch_size)
    passes, rest = divmod(int(steps), per_pass)
    epoch = initial_epoch
    for epochs, length in ((passes, per_pass), (1 if rest else 0, rest)):
        if epochs:
            model.fit(x, y, batch_size=batch_size, initial_epoch=epoch, epochs=epoch + epochs,
                      steps_per_epoch=length, shuffle=True, verbose=0,
                      callbacks=list(callbacks))
            epoch += epochs
    return epoch


class FitNumpyVariant(_StepWindow):
    """Keras ``Model.fit`` on in-memory numpy arrays (uint8 pixels; the model
    rescales), shuffled each epoch by Keras."""

    consumed = "model.fit(numpy), callback timing"

    def __init__(self, name, model_name, settings, arrays, description=""):
        super().__init__(name, model_name, settings, description)
        self.arrays = arrays

    def build(self):
        self.model = compiled(self.model_name, self.settings.seed)

    def _run(self, steps):
        times = []
        x, y = self.arrays
        restore_v2_layer_classes(self.model_name)
        fit_numpy_steps(self.model, x, y, self.settings.batch_size, self.warm + steps,
                        callbacks=[KerasTimer(times)])
        return timed_part(times, self.warm)


class FitDatasetVariant(_StepWindow):
    """Keras ``Model.fit`` on this package's ``make_dataset``."""

    consumed = "model.fit(make_dataset), callback timing"

    def __init__(self, name, model_name, settings, path, description=""):
        super().__init__(name, model_name, settings, description)
        self.path = path

    def build(self):
        from estimator_keras import inputs  # pylint: disable=import-outside-toplevel

        self.model = compiled(self.model_name, self.settings.seed)
        self.dataset = inputs.make_dataset(self.path, self.settings.batch_size, training=True,
                                           features={IMAGE: IMAGE}, label=LABEL)

    def _run(self, steps):
        times = []
        restore_v2_layer_classes(self.model_name)
        self.model.fit(self.dataset, epochs=1, steps_per_epoch=self.warm + steps, verbose=0,
                       callbacks=[KerasTimer(times)])
        return timed_part(times, self.warm)


class QueueRunnerTrainVariant(_StepWindow):
    """The seed answer's loop: Keras layers on ``shuffle_batch`` tensors in a
    v1 graph, ``session.run(train_op)`` per step; a fresh session (and fresh
    queue threads) per window."""

    consumed = "v1 session.run(train_op) loop, queue runners"

    def __init__(self, name, model_name, settings, files, schema, num_threads=legacy.SEED_THREADS,
                 description=""):
        super().__init__(name, model_name, settings, description)
        self.files, self.schema, self.num_threads = files, schema, num_threads

    def build(self):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.compat.v1.set_random_seed(self.settings.seed)
            images, labels = legacy.queue_runner_batch(self.files, self.schema,
                                                       self.settings.batch_size,
                                                       self.num_threads)
            self.train_op, self.loss, _ = legacy.train_op_for(
                build_fn(self.model_name), images, labels, LEARNING_RATE)
            self.init = tf.compat.v1.global_variables_initializer()

    def _run(self, steps):
        with legacy.QueueRunnerSession(self.graph, [self.init]) as sess:
            for _ in range(self.warm):
                sess.run(self.train_op)
            start = time.perf_counter()
            for _ in range(steps):
                sess.run(self.train_op)
            return steps, time.perf_counter() - start


class FeedDictTrainVariant(_StepWindow):
    """The seed question's loop: ``session.run(train_op, feed_dict=...)`` with
    numpy batches from a ``next_batch``-style batcher."""

    consumed = "v1 session.run(train_op, feed_dict) loop"

    def __init__(self, name, model_name, settings, arrays, schema, description=""):
        super().__init__(name, model_name, settings, description)
        self.arrays, self.schema = arrays, schema

    def build(self):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        x, y = self.arrays
        self.batcher = legacy.NumpyBatcher(x.astype("float32"), y, self.settings.batch_size,
                                           self.settings.seed)
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.compat.v1.set_random_seed(self.settings.seed)
            self.images, self.labels = legacy.placeholders(self.schema)
            self.train_op, self.loss, _ = legacy.train_op_for(
                build_fn(self.model_name), self.images, self.labels, LEARNING_RATE)
            init = tf.compat.v1.global_variables_initializer()
        self.session = tf.compat.v1.Session(graph=self.graph)
        self.session.run(init)

    def _step(self):
        x, y = self.batcher.next_batch()
        self.session.run(self.train_op, feed_dict={self.images: x, self.labels: y})

    def _run(self, steps):
        for _ in range(self.warm):
            self._step()
        start = time.perf_counter()
        for _ in range(steps):
            self._step()
        return steps, time.perf_counter() - start

    def close(self):
        self.session.close()


def real_input_fn(path, settings, cache="auto"):
    """A factory of this package's training input_fn over ``path``; by
    default with the experiments' ``cache="auto"``."""
    from estimator_keras import inputs  # pylint: disable=import-outside-toplevel

    return lambda: inputs.make_input_fn(path, settings.batch_size, training=True,
                                        features={IMAGE: IMAGE}, label=LABEL, cache=cache)


def cache_fill_steps(model_name, settings, arrays):
    """Untimed steps that fill a cached pipeline's cache: one epoch for the
    MLP. Not for the CNN, where an epoch is about 30 s per window and its
    cache=False row shows the cache makes no difference to it."""
    if model_name != "seed_mlp":
        return 0
    return math.ceil(len(arrays[1]) / settings.batch_size)


def variants(model_name, path, settings, arrays, threads=True):
    resolved = common.dataset_info(path, "train")
    fill = cache_fill_steps(model_name, settings, arrays)
    out = [
        EstimatorVariant("estimator", model_name, settings, real_input_fn(path, settings),
                         description="to_estimator + make_input_fn, the experiments' "
                                     "pipeline (cache=auto)", fill_steps=fill),
        EstimatorVariant("estimator cache=False", model_name, settings,
                         real_input_fn(path, settings, cache=False),
                         description="the same with the library's default cache=False",
                         group="knob"),
        FitNumpyVariant("fit_numpy", model_name, settings, arrays,
                        "Keras Model.fit on numpy arrays in memory"),
        FitDatasetVariant("fit_dataset", model_name, settings, path,
                          "Keras Model.fit on make_dataset"),
        QueueRunnerTrainVariant("queue_runners", model_name, settings, resolved.files,
                                resolved.schema, description="v1 graph + shuffle_batch "
                                "(32 threads) + session loop"),
        FeedDictTrainVariant("feed_dict", model_name, settings, arrays, resolved.schema,
                             "v1 graph + placeholders fed numpy + session loop"),
    ]
    if threads:
        for suffix, inter, intra in THREADS:
            out.append(EstimatorVariant(
                f"estimator {suffix}", model_name, settings, real_input_fn(path, settings),
                session_config(inter, intra),
                description=f"Estimator with session_config inter_op={inter}, "
                            f"intra_op={intra} (default 0,0 = all cores)", group="knob",
                fill_steps=fill))
    return out


def fmt_ratio(value):
    return "-" if value is None else f"{value:.2f}x"


def run(settings, path=None, models=MODELS, threads=True):
    """Runs the table for each model; returns its result dict."""
    common.quiet_tensorflow()
    path = path or common.dataset_path(settings)
    arrays = common.load_arrays(path, "train")
    rows, targets = [], []
    load_start = output.load_average()
    for model_name in models:
        vs = variants(model_name, path, settings, arrays, threads)
        repeats = settings.repeats_for(5 if model_name == "seed_cnn" else 7)
        m = common.run_alternating(vs, repeats, f"{TABLE}/{model_name}",
                                   reference="estimator")
        model_rows = common.rows_from(vs, m, reference="estimator", unit="steps/s")
        for row in model_rows:
            row["name"] = f"{model_name} {row['name']}"
        rows.extend(model_rows)

        def est_over(name, log=m.log):
            return common.local_ratio(log, "estimator", name)

        targets += [
            common.target(f"training.{model_name}.vs_fit_numpy",
                          f"{model_name}: Estimator / Model.fit on numpy", est_over("fit_numpy"),
                          1.0),
            common.target(f"training.{model_name}.vs_queue_runners",
                          f"{model_name}: Estimator / queue-runner loop",
                          est_over("queue_runners"), 1.0),
            common.target(f"training.{model_name}.vs_feed_dict",
                          f"{model_name}: Estimator / feed_dict loop", est_over("feed_dict"),
                          0.95),
        ]
        if model_name == "seed_mlp":
            targets.append(common.target(
                "training.seed_mlp.vs_feed_dict_1.2",
                "seed_mlp: Estimator (experiments' cached pipeline) / feed_dict loop (issue 15)",
                est_over("feed_dict"), 1.2,
                why="the Estimator without the cache runs at "
                    f"{fmt_ratio(common.local_ratio(m.log, 'estimator cache=False', 'estimator'))}"
                    " the cached one's speed"))
    return {"table": TABLE, "title": TITLE, "unit": "steps/s", "rows": rows,
            "columns": ["name", "median", "min", "max", "ratio", "ratio_best", "window_steps"],
            "targets": targets, "dataset": path, "load_before": load_start,
            "load_after": output.load_average(),
            "notes": ["ratio = median over windows of (rate / mean rate of the nearest "
                      "`estimator` windows of the same model before and after it; the "
                      "estimator runs after every 3 other windows); targets use the same "
                      "local ratios", "ratio_best = best window / best `estimator` window",
                      "each window: untimed warm-up steps, then timed steps; graph build "
                      "and session start between windows are not timed"]}
