"""Table "tuning" (slow): what a study finds for its compute, on
``fashion_mnist_mlp`` with a 3-parameter space (learning rate and hidden
units log-scaled, batch size), 24 trials of 1500 steps, three seeds.

Each method runs as a user runs it:

- ``random``, ``tpe`` and ``tpe+hyperband``: ``python -m experiments tune
  fashion_mnist_mlp --algorithm random|tpe [--pruner hyperband] --trials 24
  --parallel 1 --seed S --max-steps 1500 --eval-every 250 --engine keras3``
  (Keras 3 on TensorFlow, the Quickstart's engine). A trial's accuracy is its
  export's (the test split at its last step); a pruned trial counts the steps
  its checkpoint holds (it trains on until the SIGTERM lands).
- ``kt-hyperband`` and ``kt-bayesian``: keras-tuner on plain Keras 3 (same
  backend), the same model (the experiment's own builder), data (the
  prepared records, read into arrays), space, Adam and evaluation (the test
  split every 250 steps: an "epoch" of 250 steps), the same 24 x 1500 = 36,000
  steps: Bayesian optimization with 24 trials of 6 epochs; Hyperband with
  ``max_epochs=6, factor=3`` and as many iterations as the budget allows, cut
  when the steps are spent. A trial's accuracy is its last epoch's.

For each method and seed: the best final accuracy, the steps it trained, and
the steps it took until its best so far first reached random search's best
(of the same seed), all computed from the trials' records (each trial's steps
and final accuracy, in the order run), which each row keeps. Random search's
own ``steps_to_random_best`` is the steps it needed to find its best. Targets,
per seed: TPE + Hyperband pruning reaches random search's best in no more
steps than random search needed for it, and ends at least as good as
keras-tuner's best (either tuner). Every seed is reported, met or not.
"""

import json
import os
import shutil
import sys
import time

from benchmarks import common, output

TABLE = "tuning"
TITLE = ("fashion_mnist_mlp, 24 trials x 1500 steps: best accuracy and steps trained, "
         "Optuna through `tune` vs keras-tuner")
SPACE = ("learning_rate: {type: double, min: 0.0001, max: 0.1, scale: log}\n"
         "units: {type: integer, min: 16, max: 512, scale: log}\n"
         "batch_size: {type: integer, min: 16, max: 256, scale: log}\n")
FULL = {"trials": 24, "steps": 1500, "every": 250, "seeds": (1, 2, 3)}
QUICK = {"trials": 4, "steps": 200, "every": 100, "seeds": (1,)}
OURS = {"random": ("random", "none"), "tpe": ("tpe", "none"),
        "tpe+hyperband": ("tpe", "hyperband")}
PEERS = ("kt-hyperband", "kt-bayesian")
METHODS = tuple(OURS) + PEERS
STUDY_TIMEOUT_S = 3 * 3600


def _curve(trials, target):
    """(best final accuracy, steps, steps until the best so far reached
    ``target``) of trials ``[(steps, accuracy or None)]`` in the order run."""
    best, spent, reached = None, 0, None
    for steps, accuracy in trials:
        spent += steps
        if accuracy is not None and (best is None or accuracy > best):
            best = accuracy
        if reached is None and target is not None and best is not None and best >= target:
            reached = spent
    return best, spent, reached


def _ours(settings, method, seed, scale, data_dir, space_file):
    algorithm, pruner = OURS[method]
    folder = os.path.join(settings.workdir, f"{method}-{seed}")
    shutil.rmtree(folder, ignore_errors=True)
    args = ["tune", "fashion_mnist_mlp", "--space", space_file, "--algorithm", algorithm,
            "--pruner", pruner, "--trials", scale["trials"], "--parallel", 1, "--seed", seed,
            "--model-dir", folder, "--data-dir", data_dir, "--max-steps", scale["steps"],
            "--eval-every", scale["every"], "--engine", "keras3", "--no-plots"]
    rc, _, err, seconds = common.run_experiments(
        args, STUDY_TIMEOUT_S, env={"KERAS_BACKEND": "tensorflow", "TF_USE_LEGACY_KERAS": None})
    if rc != 0:
        return {"error": f"tune exited {rc}: {err.strip()[-600:]}"}
    return {**study_record(folder), "seconds": round(seconds, 1)}


def study_record(folder):
    """A ``tune`` study's trials from its ``trials.json``: ``trials`` as
    ``[steps, accuracy or None]`` in the order run (one at a time: the trial
    numbers' order), a pruned or failed trial's accuracy None (it exported
    nothing), and how many were pruned and failed."""
    with open(os.path.join(folder, "trials.json"), encoding="utf-8") as f:
        rows = json.load(f)["trials"]
    trials = [[r["steps"] or 0, r["metric"] if r["status"] == "succeeded" else None]
              for r in sorted(rows, key=lambda r: r["trial"])]
    return {"trials": trials, "pruned": sum(r["status"] == "pruned" for r in rows),
            "failed": sum(r["status"] not in ("succeeded", "pruned") for r in rows)}


def keras_tuner_study():
    """One keras-tuner study in this process (argv: method, seed, dataset path,
    trials, steps, every, workdir, result file)."""
    method, seed, path, trials, steps, every, workdir, out = sys.argv[1:9]
    seed, trials, steps, every = int(seed), int(trials), int(steps), int(every)
    os.environ.pop("TF_USE_LEGACY_KERAS", None)
    os.environ["KERAS_BACKEND"] = "tensorflow"
    tf = common.quiet_tensorflow()
    import keras  # pylint: disable=import-outside-toplevel
    import keras_tuner as kt  # pylint: disable=import-outside-toplevel
    from estimator_keras import manifest  # pylint: disable=import-outside-toplevel
    from experiments.catalog import models  # pylint: disable=import-outside-toplevel
    from experiments.config import data_info  # pylint: disable=import-outside-toplevel

    x_train, y_train = common.load_arrays(path, "train")
    x_test, y_test = common.load_arrays(path, "test")
    data = data_info.describe(manifest.load_manifest(path), _data_config())
    budget = trials * steps
    spent = {"steps": 0}
    finals = []

    class Spent(Exception):
        pass

    class Budget(keras.callbacks.Callback):
        """Counts every step trained; stops at the budget: the trial in
        flight ends there, later ones are refused before a step (keras-tuner
        ends the search after three refused in a row)."""

        def on_train_begin(self, logs=None):
            if spent["steps"] >= budget:
                raise Spent(f"the budget of {budget} steps is spent")

        def on_train_batch_end(self, batch, logs=None):
            spent["steps"] += 1
            if spent["steps"] >= budget:
                self.model.stop_training = True

    class Model(kt.HyperModel):
        def build(self, hp):
            keras.utils.set_random_seed(seed)
            model = models.seed_mlp({"units": hp.Int("units", 16, 512, sampling="log"),
                                     "num_classes": 0}, data)
            model.compile(optimizer=keras.optimizers.Adam(
                hp.Float("learning_rate", 1e-4, 1e-1, sampling="log")),
                loss="sparse_categorical_crossentropy", metrics=["accuracy"])
            return model

        def fit(self, hp, model, *args, **kwargs):
            batch = hp.Int("batch_size", 16, 256, sampling="log")
            train = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(
                10_000, seed=seed).repeat().batch(batch).prefetch(2)
            before = spent["steps"]
            history = model.fit(train, steps_per_epoch=every, validation_data=(x_test, y_test),
                                validation_batch_size=1000, verbose=0, **kwargs)
            accuracy = (history.history.get("val_accuracy") or [None])[-1]
            trained = spent["steps"] - before
            if trained:
                finals.append((trained, accuracy))
            return history

    epochs = steps // every
    common_args = dict(objective="val_accuracy", seed=seed, directory=workdir,
                       project_name=f"{method}-{seed}", overwrite=True,
                       max_consecutive_failed_trials=3)
    if method == "kt-bayesian":
        tuner = kt.BayesianOptimization(Model(), max_trials=trials, **common_args)
    else:
        tuner = kt.Hyperband(Model(), max_epochs=epochs, factor=3, hyperband_iterations=50,
                             **common_args)
    started = time.perf_counter()
    try:
        tuner.search(epochs=epochs, callbacks=[Budget()])
    except (RuntimeError, Spent) as e:  # the trials refused once the budget is spent
        if spent["steps"] < budget:
            raise
        common.say(f"[{TABLE}] {method} {seed}: budget spent ({e.__class__.__name__})")
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"trials": finals, "seconds": round(time.perf_counter() - started, 1),
                   "keras_tuner": kt.__version__, "keras": keras.__version__}, f)


def _data_config():
    from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel
    from experiments.catalog import registry  # pylint: disable=import-outside-toplevel
    catalog.load()
    return registry.get("fashion_mnist_mlp").config.data


def _peer(settings, method, seed, scale, path):
    import subprocess  # pylint: disable=import-outside-toplevel
    workdir = os.path.join(settings.workdir, f"{method}-{seed}")
    out = os.path.join(settings.workdir, f"{method}-{seed}.json")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", KERAS_BACKEND="tensorflow")
    env.pop("TF_USE_LEGACY_KERAS", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(common.HERE),
                                                     env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-c",
               "from benchmarks import tuning_table as t; t.keras_tuner_study()", method,
               str(seed), path, str(scale["trials"]), str(scale["steps"]), str(scale["every"]),
               workdir, out]
    proc = subprocess.run(command, env=env, capture_output=True, text=True,
                          timeout=STUDY_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        return {"error": f"keras-tuner exited {proc.returncode}: {proc.stderr.strip()[-600:]}"}
    with open(out, encoding="utf-8") as f:
        result = json.load(f)
    result["trials"] = [tuple(t) for t in result["trials"]]
    return result


def table_rows(results, seeds):
    """One row per method and seed, from each study's trial records
    (``results[(method, seed)]`` as :func:`study_record` or a keras-tuner
    study gives them, or ``{"error": ...}``)."""
    rows = []
    for seed in seeds:
        random_best = _curve(results.get(("random", seed), {}).get("trials", []), None)[0]
        for method in METHODS:
            result = results.get((method, seed))
            if result is None:
                continue
            best, spent, reached = _curve(result.get("trials", []), random_best)
            rows.append({"name": f"{method} (seed {seed})", "method": method, "seed": seed,
                         "best_accuracy": best, "steps": spent,
                         "steps_to_random_best": reached,
                         "trials": len(result.get("trials", [])),
                         "pruned": result.get("pruned"), "wall_s": result.get("seconds"),
                         "error": result.get("error"),
                         "trial_records": [list(t) for t in result.get("trials", [])]})
    return rows


def table_targets(rows, seeds):
    """Per seed: the steps TPE + Hyperband needed to reach random search's
    best against the steps random search needed (each row's
    ``steps_to_random_best``), and its best against keras-tuner's."""
    targets = []
    for seed in seeds:
        row = {r["method"]: r for r in rows if r["seed"] == seed}
        ours, random = row.get("tpe+hyperband", {}), row.get("random", {})
        needed, reached = random.get("steps_to_random_best"), ours.get("steps_to_random_best")
        targets.append(common.target(
            f"tuning.steps_to_random_best.seed{seed}",
            f"seed {seed}: TPE + Hyperband pruning reaches random search's best accuracy "
            f"({output.fmt_value(random.get('best_accuracy'))}) in no more steps than random "
            f"search needed for it ({needed} of its {random.get('steps')})",
            (reached if reached is not None else float("inf")) if needed is not None else None,
            needed, op="<=",
            why=(None if needed is None or reached is not None else
                 f"its best, {output.fmt_value(ours.get('best_accuracy'))}, never reached it")))
        peer_best = max((row[p]["best_accuracy"] for p in PEERS
                         if row.get(p, {}).get("best_accuracy") is not None), default=None)
        targets.append(common.target(
            f"tuning.vs_keras_tuner.seed{seed}",
            f"seed {seed}: TPE + Hyperband ends at least as good as keras-tuner's best "
            f"({output.fmt_value(peer_best)})",
            ours.get("best_accuracy") if peer_best is not None else None, peer_best, op=">="))
    return targets


def run(settings):
    scale = QUICK if settings.quick else FULL
    path = common.dataset_path(settings)
    data_dir = common.experiments_data_dir(settings, path)
    space_file = os.path.join(settings.workdir, "space.yaml")
    with open(space_file, "w", encoding="utf-8") as f:
        f.write(SPACE)
    load_start = output.load_average()
    results = {}
    for seed in scale["seeds"]:
        for method in METHODS:
            result = (_ours(settings, method, seed, scale, data_dir, space_file)
                      if method in OURS else _peer(settings, method, seed, scale, path))
            results[(method, seed)] = result
            common.say(f"[{TABLE}] seed {seed} {method}: " + (
                result.get("error") or "best %s, %d steps, %d trials" % (
                    output.fmt_value(_curve(result["trials"], None)[0]),
                    _curve(result["trials"], None)[1], len(result["trials"]))))
    rows = table_rows(results, scale["seeds"])
    targets = table_targets(rows, scale["seeds"])
    versions = next((r for r in results.values() if "keras_tuner" in r), {})
    return {"table": TABLE, "title": TITLE, "unit": "accuracy / steps", "rows": rows,
            "columns": ["name", "best_accuracy", "steps", "steps_to_random_best", "trials",
                        "pruned", "wall_s"],
            "targets": targets, "dataset": path, "load_before": load_start,
            "load_after": output.load_average(),
            "notes": [
                f"{scale['trials']} trials x {scale['steps']} steps, evaluating every "
                f"{scale['every']} (the test split); space: learning_rate 1e-4..1e-1 log, "
                f"units 16..512 log, batch_size 16..256 log; seeds "
                f"{', '.join(map(str, scale['seeds']))}; one trial at a time",
                "steps_to_random_best: steps spent, in the order the trials ran, until the "
                "method's best so far first reached random search's best of the same seed "
                "(random search's own: the steps it needed to find its best); "
                "trial_records: each trial's [steps, final accuracy], in that order",
                f"keras-tuner {versions.get('keras_tuner', '?')} on Keras "
                f"{versions.get('keras', '?')}, TensorFlow backend"]}
