"""The tuning table's rows and targets, computed from studies' trial records:
two tiny real studies that ``tune`` recorded (``tests/tuning_records``:
the table's own ``tune`` command on fashion_mnist_mlp with 3,000 examples, the
table's space, 8 trials of 90 steps evaluated every 10, seed 1, random search
and TPE + Hyperband, each study's ``trials.json`` as written), and the
published run of the full table."""

import json
import os

from benchmarks import tuning_table

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDS = os.path.join(HERE, "tuning_records")
PUBLISHED = os.path.join(os.path.dirname(HERE), "benchmarks", "published",
                         "tuning-2296b9e.json")


def _recorded(name):
    with open(os.path.join(RECORDS, name, "trials.json"), encoding="utf-8") as f:
        return sorted(json.load(f)["trials"], key=lambda r: r["trial"])


def _steps_until(trials, target):
    """The steps of the trials run up to the first whose accuracy reaches
    ``target`` (None: none does)."""
    for i, (_, accuracy) in enumerate(trials):
        if accuracy is not None and accuracy >= target:
            return sum(steps for steps, _ in trials[:i + 1])
    return None


def test_the_tuning_tables_rows_and_target_come_from_the_trials_records():
    results = {("random", 1): tuning_table.study_record(os.path.join(RECORDS, "random-1")),
               ("tpe+hyperband", 1): tuning_table.study_record(
                   os.path.join(RECORDS, "tpe-hyperband-1"))}
    # A trial's record: its steps and, if it finished, its accuracy (a pruned
    # trial's last evaluation is no result: it exported nothing).
    for (method, _), name in ((("random", 1), "random-1"),
                              (("tpe+hyperband", 1), "tpe-hyperband-1")):
        recorded = _recorded(name)
        assert results[(method, 1)]["trials"] == [
            [r["steps"], r["metric"] if r["status"] == "succeeded" else None] for r in recorded]
        assert results[(method, 1)]["pruned"] == sum(r["status"] == "pruned" for r in recorded)
    assert results[("tpe+hyperband", 1)]["pruned"] >= 1
    assert any(r["status"] == "pruned" and r["metric"] is not None
               for r in _recorded("tpe-hyperband-1"))

    rows = {r["method"]: r for r in tuning_table.table_rows(results, (1,))}
    assert set(rows) == {"random", "tpe+hyperband"}
    random_trials = results[("random", 1)]["trials"]
    ours_trials = results[("tpe+hyperband", 1)]["trials"]
    random_best = max(a for _, a in random_trials if a is not None)
    needed = _steps_until(random_trials, random_best)
    reached = _steps_until(ours_trials, random_best)
    assert rows["random"]["best_accuracy"] == random_best
    assert rows["random"]["steps_to_random_best"] == needed
    assert rows["random"]["steps"] == sum(s for s, _ in random_trials)
    assert rows["tpe+hyperband"]["steps_to_random_best"] == reached
    assert rows["tpe+hyperband"]["steps"] == sum(s for s, _ in ours_trials)

    steps_target, peer_target = tuning_table.table_targets(list(rows.values()), (1,))
    assert steps_target["id"] == "tuning.steps_to_random_best.seed1"
    assert steps_target["threshold"] == needed and steps_target["op"] == "<="
    assert steps_target["value"] == (reached if reached is not None else float("inf"))
    assert steps_target["met"] is (reached is not None and reached <= needed)
    assert "(%d of its %d)" % (needed, rows["random"]["steps"]) in steps_target["description"]
    # No keras-tuner study here: that target is unmeasured, not met or missed.
    assert peer_target["met"] is None

    # The rows keep the records: the JSON alone gives the same table again.
    again = tuning_table.table_rows(
        {(r["method"], 1): {"trials": json.loads(json.dumps(r["trial_records"]))}
         for r in rows.values()}, (1,))
    assert [(r["best_accuracy"], r["steps"], r["steps_to_random_best"]) for r in again] == [
        (r["best_accuracy"], r["steps"], r["steps_to_random_best"]) for r in rows.values()]


def test_the_published_run_read_against_the_new_target():
    with open(PUBLISHED, encoding="utf-8") as f:
        table = json.load(f)["tables"]["tuning"]
    seeds = (1, 2, 3)
    assert tuning_table.FULL["seeds"] == seeds
    targets = {t["id"]: t for t in tuning_table.table_targets(table["rows"], seeds)}
    needed = {r["seed"]: r["steps_to_random_best"] for r in table["rows"]
              if r["method"] == "random"}
    reached = {r["seed"]: r["steps_to_random_best"] for r in table["rows"]
               if r["method"] == "tpe+hyperband"}
    met = []
    for seed in seeds:
        target = targets["tuning.steps_to_random_best.seed%d" % seed]
        assert (target["value"], target["threshold"]) == (reached[seed], needed[seed])
        met.append(target["met"])
    # What BENCHMARKS.md's tuning section says of this run: seeds 1 and 2
    # met, seed 3 missed (random search found its best in 9,000 steps).
    assert met == [True, True, False]
    assert [targets["tuning.vs_keras_tuner.seed%d" % s]["met"] for s in seeds] == [True] * 3
