"""Katib Experiments that Katib runs: what ``submit --target katib`` writes,
checked against the rules Katib v0.19.0 applies to an Experiment, restated
here from its source (each rule names the file of the v0.19.0 tag it comes
from; none of Katib's code is used), and the refusals, through the CLI,
where a study cannot meet them.
"""

import math
import os
import re
import subprocess
import tempfile

import pytest
import yaml

from support import cli

ARGS = ["submit", "fashion_mnist_mlp", "--target", "katib", "--container-image",
        "us-docker.pkg.dev/p/r/estimator-keras:1", "--job-dir", "gs://my-bucket/katib",
        "--data-dir", "gs://my-bucket/data", "--max-steps", "1500", "--eval-every", "250"]
LINEAR = ("learning_rate: {type: double, min: 0.0001, max: 0.1}\n"
          "units: {type: integer, min: 16, max: 256}\n")
LOG_DOUBLE = ("learning_rate: {type: double, min: 0.0001, max: 0.1, scale: log}\n"
              "units: {type: integer, min: 16, max: 256}\n")
GRID = ("units: {type: discrete, values: [64, 128]}\n"
        "optimizer: {type: categorical, values: [adam, rmsprop]}\n")
# What the experiment's trials evaluate at: ARGS' --max-steps and --eval-every.
MAX_STEPS, EVERY = 1500, 250


def _run(tmp_path, space_text, *extra):
    space = tmp_path / "space.yaml"
    space.write_text(space_text)
    out = tmp_path / "experiment.yaml"
    if out.exists():
        out.unlink()
    rc, _, err = cli(*ARGS, "--tune", space, "--output", out, *extra, timeout=120)
    return rc, err, (yaml.safe_load(out.read_text()) if out.exists() else None)


def _written(tmp_path, space_text, *extra):
    rc, err, experiment = _run(tmp_path, space_text, *extra)
    assert rc == 0, err
    return experiment


def _refused(tmp_path, space_text, *extra):
    rc, err, experiment = _run(tmp_path, space_text, *extra)
    assert rc == 2, err
    assert experiment is None  # nothing written
    return " ".join(err.split())


def _settings(experiment):
    return {s["name"]: s["value"]
            for s in experiment["spec"]["algorithm"].get("algorithmSettings", [])}


# --- The rules, restated from Katib v0.19.0 ---------------------------------

def hyperband_min_parallel(settings):
    """pkg/suggestion/v1beta1/hyperband/service.py, ValidateAlgorithmSettings:
    eta is the integer part of the eta setting (3 when absent or not positive);
    s_max is the integer part of log(r_l) / log(eta) in floating point; a
    parallelTrialCount below ceil(eta ** s_max) is refused."""
    eta = int(float(settings.get("eta", "3")))
    eta = eta if eta > 0 else 3
    s_max = int(math.log(float(settings["r_l"])) / math.log(eta))
    return int(math.ceil(eta ** s_max))


def hyperband_rungs(settings, parallel, max_trials):
    """The rungs Katib runs for a hyperband Experiment, as (trials, resource).

    pkg/suggestion/v1beta1/hyperband/service.py: the first bracket (s = s_max)
    makes as many configurations as the controller asks for, each with the
    resource int(r_l * eta ** -s_max); its reply stores r as text, which the
    next call reads back as int(float(r)); a later rung keeps the best
    ceil(n / eta) of the n configurations it is asked for (n: the number the
    controller asks for now) at int(r * eta ** i).
    pkg/controller.v1beta1/experiment/experiment_controller.go: the controller
    asks for min(parallelTrialCount, maxTrialCount - completed) - active
    trials; pkg/controller.v1beta1/suggestion/suggestionclient/suggestionclient.go
    drops an answer whose length differs from the number asked for, and the
    service fails while a rung still has trials running. So the second rung
    starts once the first has finished, asked for min(parallel, max_trials -
    parallel) trials; it is answered only when that is 1.
    Returns the rungs, or None where the Experiment would wait forever.
    """
    eta = float(settings["eta"])
    r_l = float(settings["r_l"])
    s_max = int(math.log(r_l) / math.log(eta))
    first = min(parallel, max_trials)
    r = r_l * eta ** -s_max
    rungs = [(first, int(r))]
    asked = min(parallel, max_trials - first)
    if asked <= 0 or s_max == 0:
        return rungs
    if math.ceil(asked / eta) != asked:
        return None
    rungs.append((1, int(int(float(str(r))) * eta)))
    return rungs if max_trials == first + 1 else None


def cmaes_numeric(experiment):
    """pkg/suggestion/v1beta1/goptuna/service.go (and optuna/service.py):
    cmaes needs two or more parameters of type double or int."""
    return sum(p["parameterType"] in ("double", "int") for p in experiment["spec"]["parameters"])


def grid_combinations(experiment):
    """pkg/suggestion/v1beta1/optuna/service.py with internal/search_space.py:
    an int spans min..max by its step (1 by default), a double needs a step,
    a discrete or categorical is its list; maxTrialCount above the product is
    refused."""
    total = 1
    for p in experiment["spec"]["parameters"]:
        space = p["feasibleSpace"]
        if p["parameterType"] == "int":
            total *= len(range(int(space["min"]), int(space["max"]) + 1, int(space.get("step", 1))))
        elif p["parameterType"] == "double":
            assert "step" in space, "Katib's grid has no values for %s" % p["name"]
        else:
            total *= len(space["list"])
    return total


# The scale each service samples a double or an int on, whatever its
# distribution says: pkg/suggestion/v1beta1/skopt/base_service.py (a double is
# a log-uniform Real, an int a uniform Integer), goptuna/converter.go (uniform
# distributions for cmaes and sobol), hyperband/parameter.py (uniform between
# the bounds). hyperopt (tpe, random) follows logUniform.
SAMPLED_SCALES = {"bayesianoptimization": {"double": "log", "int": "linear"},
                  "cmaes": {"double": "linear", "int": "linear"},
                  "sobol": {"double": "linear", "int": "linear"},
                  "hyperband": {"double": "linear", "int": "linear"}}


def scales_hold(experiment):
    fixed = SAMPLED_SCALES.get(experiment["spec"]["algorithm"]["algorithmName"], {})
    for p in experiment["spec"]["parameters"]:
        asked = "log" if p["feasibleSpace"].get("distribution") == "logUniform" else "linear"
        if p["parameterType"] in fixed and fixed[p["parameterType"]] != asked:
            return False
    return True


def validator_holds(experiment):
    """pkg/webhook/v1beta1/experiment/validator/validator.go: the name starts
    with a lower-case letter and has at most 40 characters; parallelTrialCount
    and maxFailedTrialCount are at most maxTrialCount."""
    spec, name = experiment["spec"], experiment["metadata"]["name"]
    return (re.match(r"^[a-z]([-a-z0-9]*[a-z0-9])?$", name) is not None and len(name) <= 40
            and spec["parallelTrialCount"] <= spec["maxTrialCount"]
            and spec.get("maxFailedTrialCount", 0) <= spec["maxTrialCount"])


def katib_shell(experiment, values, trial="trial-abc"):
    """The words the trial's program receives, through a real ``sh``.

    The controller substitutes each ``${trialParameters.NAME}`` and
    ``${trialSpec.Name}`` in the template's text
    (pkg/controller.v1beta1/experiment/manifest/generator.go); the StdOut
    collector's webhook (pkg/webhook/v1beta1/pod/utils.go) keeps a command
    that starts with ``sh -c`` and appends its redirect to the script, or else
    joins all the command's words with spaces into one ``sh -c`` script; the
    redirect sends the output to the file it reads. ``python`` is a shell
    function here that prints its arguments."""
    container, = experiment["spec"]["trialTemplate"]["trialSpec"]["spec"]["template"][
        "spec"]["containers"]
    command = container["command"]
    script = command[2] if command[:2] == ["sh", "-c"] else " ".join(command)
    for name, value in values.items():
        script = script.replace("${trialParameters.%s}" % name, value)
    script = script.replace("${trialSpec.Name}", trial)
    with tempfile.TemporaryDirectory() as folder:
        log, mark = os.path.join(folder, "metrics.log"), os.path.join(folder, "done")
        script += " 1>%s 2>&1 && echo completed > %s" % (log, mark)
        subprocess.run(["sh", "-c", "python() { printf '%s\\n' \"$@\"; }; " + script],
                       capture_output=True, text=True, timeout=30, check=True)
        # The collector reads the log once the mark says the program ended.
        with open(mark, encoding="utf-8") as f:
            assert f.read() == "completed\n"
        with open(log, encoding="utf-8") as f:
            return f.read().splitlines()


def _flag(argv, flag):
    return argv[argv.index(flag) + 1]


# --- What the command writes holds them --------------------------------------

def test_a_hyperband_experiment_is_one_katib_accepts_and_finishes(tmp_path):
    experiment = _written(tmp_path, LINEAR, "--algorithm", "hyperband",
                          "--parallel-trials", "6", "--max-trials", "7")
    spec, settings = experiment["spec"], _settings(experiment)
    assert validator_holds(experiment) and scales_hold(experiment)
    assert spec["parallelTrialCount"] >= hyperband_min_parallel(settings)
    resource = settings["resource_name"]
    # service.py: the resource must be one of the parameters.
    assert resource in [p["name"] for p in spec["parameters"]]
    rungs = hyperband_rungs(settings, spec["parallelTrialCount"], spec["maxTrialCount"])
    assert rungs is not None, "the Experiment would wait forever after its first rung"
    assert sum(n for n, _ in rungs) == spec["maxTrialCount"]
    # A failed trial would stop the rungs too: the first one fails the Experiment.
    assert spec["maxFailedTrialCount"] == 0
    # What the docs promise: the first rung trains to the first evaluation, the
    # best configuration then trains --max-steps.
    steps = [int(_flag(katib_shell(experiment, {"learning_rate": "0.003", "units": "64",
                                                resource: str(r)}), "--max-steps"))
             for _, r in rungs]
    assert steps == [EVERY, MAX_STEPS]
    argv = katib_shell(experiment, {"learning_rate": "0.003", "units": "64", resource: "1"})
    assert _flag(argv, "--eval-every") == str(EVERY)
    assert "--learning_rate=0.003" in argv and "--units=64" in argv
    assert _flag(argv, "--model-dir") == "gs://my-bucket/katib/trials/trial-abc"
    # Flags beat --hparams: the resource is never an hparam of the trial.
    assert not any(a.startswith("--%s=" % resource) for a in argv)


def test_the_hyperband_rules_hold_for_any_evaluation_count(tmp_path):
    """Katib computes its rungs in floating point: 49 * 49 ** -1 is below 1."""
    for max_steps in (2 * EVERY, 49 * EVERY):
        n = max_steps // EVERY
        args = [a if a != "1500" else str(max_steps) for a in ARGS]
        space = tmp_path / "space.yaml"
        space.write_text(LINEAR)
        out = tmp_path / ("hyperband-%d.yaml" % n)
        rc, _, err = cli(*args, "--tune", space, "--output", out, "--algorithm", "hyperband",
                         "--parallel-trials", n, "--max-trials", n + 1, timeout=120)
        assert rc == 0, err
        experiment = yaml.safe_load(out.read_text())
        settings = _settings(experiment)
        assert experiment["spec"]["parallelTrialCount"] >= hyperband_min_parallel(settings)
        assert hyperband_rungs(settings, n, n + 1) == [(n, 1), (1, n)]


@pytest.mark.parametrize("algorithm, space_text", [
    ("tpe", LOG_DOUBLE), ("random", LOG_DOUBLE), ("cmaes", LINEAR), ("sobol", LINEAR),
    ("bayesianoptimization", LOG_DOUBLE), ("grid", GRID)])
def test_every_algorithms_experiment_meets_its_services_rules(tmp_path, algorithm, space_text):
    experiment = _written(tmp_path, space_text, "--algorithm", algorithm,
                          "--parallel-trials", "2", "--max-trials", "4")
    assert validator_holds(experiment) and scales_hold(experiment)
    if algorithm == "cmaes":
        assert cmaes_numeric(experiment) >= 2
    if algorithm == "grid":
        assert experiment["spec"]["maxTrialCount"] <= grid_combinations(experiment)
    # Every word reaches the trial as written, through Katib's sh.
    values = {p["name"]: p["feasibleSpace"].get("list", [p["feasibleSpace"].get("min")])[0]
              for p in experiment["spec"]["parameters"]}
    argv = katib_shell(experiment, values)
    assert ["--%s=%s" % kv for kv in values.items()] == argv[-len(values):]


def test_a_word_with_shell_characters_survives_katibs_sh(tmp_path):
    track = "https://mlflow.example.com/?a=1&b=2"
    experiment = _written(tmp_path, LOG_DOUBLE, "--max-trials", "4", "--track", track)
    argv = katib_shell(experiment, {"learning_rate": "0.003", "units": "64"})
    assert _flag(argv, "--track") == track


def test_a_long_display_name_makes_a_name_katib_accepts(tmp_path):
    experiment = _written(tmp_path, LOG_DOUBLE, "--max-trials", "4", "--display-name",
                          "A study of the Fashion-MNIST MLP with a long and descriptive name")
    assert validator_holds(experiment)


# --- The command refuses what Katib would not run ----------------------------

@pytest.mark.parametrize("space_text, extra, expected", [
    # validator.go
    (LOG_DOUBLE, ("--parallel-trials", "5", "--max-trials", "3"),
     "--parallel-trials 5 is more than --max-trials 3"),
    # hyperband/service.py: ceil(eta ** s_max) at once.
    (LINEAR, ("--algorithm", "hyperband", "--parallel-trials", "3", "--max-trials", "12"),
     "--parallel-trials 3: Katib's hyperband here starts 6 configurations at once"),
    # The controllers: past the second rung hyperband waits forever.
    (LINEAR, ("--algorithm", "hyperband", "--parallel-trials", "6", "--max-trials", "12"),
     "--max-trials 12: Katib's hyperband (v0.19.0) can finish 7 trials here"),
    # hyperband/service.py: only succeeded trials move a rung on.
    (LINEAR, ("--algorithm", "hyperband", "--parallel-trials", "6", "--max-trials", "7",
              "--pruner", "median"), "--pruner median with Katib's hyperband"),
    # hyperband/parsing_util.py: discrete values are read as whole numbers.
    ("learning_rate: {type: discrete, values: [0.001, 0.01]}\n"
     "units: {type: integer, min: 16, max: 256}\n",
     ("--algorithm", "hyperband", "--parallel-trials", "6", "--max-trials", "7"),
     "reads discrete values as whole numbers; parameter 'learning_rate' has 0.001, 0.01"),
    # goptuna/service.go
    ("learning_rate: {type: double, min: 0.0001, max: 0.1}\n",
     ("--algorithm", "cmaes", "--max-trials", "4"),
     "Katib's cmaes (its goptuna service, v0.19.0) needs two or more double or integer"),
    # optuna/service.py
    (GRID, ("--algorithm", "grid", "--max-trials", "12"),
     "--max-trials 12 is more than the 4 combinations of the grid"),
    (LINEAR, ("--algorithm", "grid", "--max-trials", "4"),
     "Katib's grid (its optuna service, v0.19.0) needs a step for every double"),
    # skopt/base_service.py, goptuna/converter.go
    (LINEAR, ("--algorithm", "bayesianoptimization", "--max-trials", "4"),
     "samples every double on a log scale, so parameter learning_rate's scale: linear"),
    (LOG_DOUBLE, ("--algorithm", "sobol", "--max-trials", "4"),
     "samples every double on a linear scale, so parameter learning_rate's scale: log"),
    (LINEAR, ("--algorithm", "hyperband", "--max-trials", "7", "--parallel-trials", "6",
              "--max-steps", "1400"), "--max-steps 1400 must be a whole number of "
                                      "--eval-every 250 periods"),
    # manifest/generator.go writes each value into the template's text.
    ("optimizer: {type: categorical, values: [adam, \"it's\"]}\n",
     ("--max-trials", "2"), "parameter 'optimizer': the value \"it's\" holds a quote"),
], ids=["parallel", "hyperband-parallel", "hyperband-trials", "hyperband-pruner",
        "hyperband-discrete", "cmaes", "grid-trials", "grid-double", "skopt-scale",
        "goptuna-scale", "hyperband-steps", "quote"])
def test_what_katib_would_refuse_or_never_finish_is_refused(tmp_path, space_text, extra,
                                                            expected):
    assert expected in _refused(tmp_path, space_text, *extra)
