"""A Kubeflow Katib ``Experiment`` (``kubeflow.org/v1beta1``, Katib v0.19) for a
study: the search space file ``tune`` and Vertex read, the metric and its goal,
the algorithm, early stopping, and a trial template that runs this package's
``train`` in a Kubernetes ``batch/v1`` Job.

* **Parameters**: double -> ``double``, integer -> ``int``, discrete ->
  ``discrete`` and categorical -> ``categorical`` (Katib's ``list``), log
  scale -> ``distribution: logUniform``; every value is a string, as Katib's
  ``FeasibleSpace`` wants.
* **Algorithm**: ``tpe``, ``cmaes``, ``random``, ``grid``, Katib's own
  ``bayesianoptimization``, ``hyperband`` and ``sobol`` (``qmc`` is Sobol's
  sequence in Katib). Each runs in one of Katib's suggestion services, whose
  rules :func:`check_rules` applies before anything is written (see below).
* **Hyperband** tunes the steps itself, counted in evaluations: its resource
  ``evaluations`` becomes ``--max-steps`` of that many ``--eval-every``
  periods (:func:`hyperband_plan`).
* **Early stopping**: any ``--pruner`` becomes Katib's ``medianstop``.
* **Metrics**: each trial runs ``train --print-evaluations``, whose
  ``accuracy=0.8123 loss=0.4321`` lines Katib's StdOut collector parses at
  every evaluation (what ``medianstop`` judges).
* **Trial**: ``train --tuning-trial`` with ``--NAME=${trialParameters.NAME}``
  arguments (they become ``--hparams``, as on Vertex), in its own model dir,
  ``JOB_DIR/trials/${trialSpec.Name}``, written as one ``sh -c`` command line
  with every word quoted: Katib's StdOut collector runs the container's
  command through ``sh -c`` anyway, its words joined by spaces
  (``pkg/webhook/v1beta1/pod/utils.go``), so unquoted words would be split.

What Katib v0.19.0 refuses or cannot run, read from its source
(``pkg/webhook/v1beta1/experiment/validator/validator.go``, the services in
``pkg/suggestion/v1beta1/``, the controllers in ``pkg/controller.v1beta1/``),
is refused here with the setting to change (:func:`check_rules`):

* ``parallelTrialCount`` at most ``maxTrialCount``; a name of at most 40
  characters (the validator).
* grid (the optuna service): no double without a step (the space file has
  none), and ``maxTrialCount`` at most the number of combinations.
* cmaes (goptuna): two or more double or int parameters.
* The scale: cmaes, sobol (goptuna) and hyperband sample every double and int
  linearly, bayesianoptimization (skopt) every double on a log scale and every
  int linearly; a space whose scale they would not follow is refused. tpe and
  random (hyperopt) follow both.
* hyperband: ``parallelTrialCount >= ceil(eta ** int(log(r_l) / log(eta)))``;
  discrete values that are whole numbers; no early stopping and no failed
  trial (a rung whose trials did not all succeed stops it); and it runs only
  its first bracket's first two rungs to the end (:func:`hyperband_plan`).

:func:`check` validates the object with the ``kubeflow-katib-api`` models
(the tune extra): a field they drop (a typo, a field of another version) is
an error, which a loose schema check would let through. TF-free.
"""

import shlex
from typing import Any, Dict, List, Optional

from estimator_keras.cloud.spec import JobSpec
from estimator_keras.cloud.tfjob import gpu_limits, job_metadata, job_program, round_trip_losses
from estimator_keras.errors import ConfigError, UsageError
from estimator_keras.tuning import space as space_lib

API_VERSION = "kubeflow.org/v1beta1"
ALGORITHMS = {"tpe": "tpe", "cmaes": "cmaes", "random": "random", "grid": "grid",
              "qmc": "sobol", "sobol": "sobol", "bayesianoptimization": "bayesianoptimization",
              "hyperband": "hyperband"}
DEFAULT_ALGORITHM = "tpe"
CONTAINER = "training-container"
_TYPES = {"double": "double", "integer": "int", "discrete": "discrete",
          "categorical": "categorical"}
# Katib's hyperband resource: the evaluations a trial trains, which its
# command multiplies by --eval-every into --max-steps.
RESOURCE = "evaluations"
# Parameters hyperband decides itself.
_HYPERBAND_OWN = (RESOURCE, "max_steps", "eval_every_steps")
# validator.go (v0.19.0): an Experiment's name has at most 40 characters.
NAME_LENGTH = 40
# The suggestion service that runs each algorithm (katib-config.yaml, v0.19.0).
SERVICES = {"tpe": "hyperopt", "random": "hyperopt", "grid": "optuna",
            "bayesianoptimization": "skopt", "cmaes": "goptuna", "sobol": "goptuna",
            "hyperband": "hyperband"}
# The scale a service samples each type on whatever the distribution says
# (absent: it follows logUniform). skopt makes every double a log-uniform
# Real; goptuna and hyperband sample uniformly between min and max.
_FIXED_SCALES = {"skopt": {"double": "log", "integer": "linear"},
                 "goptuna": {"double": "linear", "integer": "linear"},
                 "hyperband": {"double": "linear", "integer": "linear"}}
_SEEDED = ("tpe", "random", "cmaes", "bayesianoptimization")


def _feasible(p: space_lib.Parameter) -> Dict[str, Any]:
    if p.values is not None:
        space: Dict[str, Any] = {"list": [space_lib.format_value(v) for v in p.values]}
    else:
        space = {"min": space_lib.format_value(p.min), "max": space_lib.format_value(p.max)}
        if p.scale == "log":
            space["distribution"] = "logUniform"
    return space


def parameters(space: space_lib.SearchSpace) -> List[Dict[str, Any]]:
    """Katib's ``ParameterSpec`` of each parameter, in file order."""
    return [{"name": p.name, "parameterType": _TYPES[p.type], "feasibleSpace": _feasible(p)}
            for p in space.parameters]


def hyperband_plan(max_steps: Optional[int], eval_every: int) -> int:
    """N, the evaluations of ``max_steps`` at ``eval_every``: Katib's hyperband
    here gets ``eta`` N and ``r_l`` N + 0.5, its resource counted in evaluations.

    Katib v0.19.0 runs one bracket of ``s_max = int(log(r_l) / log(eta))``,
    which is 1 here: ``parallelTrialCount`` configurations trained
    ``int(r_l / eta)`` = 1 evaluation, then the best of them trained
    ``int(1 * eta)`` = N evaluations, all of ``--max-steps``. The half keeps
    Katib's float product ``r_l * eta ** -1`` above 1 (N * N ** -1 is
    0.999... for N = 49, which would give 0 evaluations). After the first
    rung the controller asks for ``k = min(parallelTrialCount, maxTrialCount
    - parallelTrialCount)`` trials and the service answers ``ceil(k / eta)``;
    the controller drops an answer of another length, so only ``k`` = 1 goes
    on and any other would wait forever: ``maxTrialCount`` is
    ``parallelTrialCount + 1``.
    """
    if not max_steps:
        raise UsageError("Katib's hyperband needs --max-steps: the most steps a trial "
                         "trains (its resource, counted in --eval-every periods).")
    if max_steps % eval_every:
        raise UsageError(
            "Katib's hyperband counts a trial's budget in evaluations: --max-steps %d must be "
            "a whole number of --eval-every %d periods (for example --max-steps %d)."
            % (max_steps, eval_every, max(1, max_steps // eval_every) * eval_every))
    evaluations = max_steps // eval_every
    if evaluations < 2:
        raise UsageError(
            "Katib's hyperband needs two or more evaluations to choose between: --max-steps "
            "%d is %d --eval-every %d period. Lower --eval-every or raise --max-steps."
            % (max_steps, evaluations, eval_every))
    return evaluations


def _grid_rules(study: space_lib.Study) -> None:
    space = study.space
    doubles = [p.name for p in space.parameters if p.type == "double"]
    if doubles:
        raise ConfigError(
            "%s: Katib's grid (its optuna service, v0.19.0) needs a step for every double, "
            "and a space file gives none: %s %s double. List the values with type: discrete, "
            "or use another --algorithm." % (space.source, ", ".join(doubles),
                                             "is" if len(doubles) == 1 else "are"))
    combinations = space.grid_size()
    if study.max_trials > combinations:
        raise UsageError(
            "--max-trials %d is more than the %d combinations of the grid of %s: Katib's grid "
            "(its optuna service, v0.19.0) refuses it. Give --max-trials %d or fewer."
            % (study.max_trials, combinations, space.source, combinations))


def _scale_rules(space: space_lib.SearchSpace, name: str) -> None:
    service = SERVICES[name]
    fixed = _FIXED_SCALES.get(service, {})
    for p in space.parameters:
        scale = fixed.get(p.type)
        if scale and p.scale != scale:
            raise ConfigError(
                "%s: Katib's %s (its %s service, v0.19.0) samples every %s on a %s scale, so "
                "parameter %s's scale: %s would not hold. Give it scale: %s, or use "
                "--algorithm tpe or random, which follow both scales."
                % (space.source, name, service, p.type, scale, p.name, p.scale, scale))


def _hyperband_rules(study: space_lib.Study, pruner: str, evaluations: int,
                     max_steps: int, eval_every: int) -> None:
    space = study.space
    own = [n for n in space.names if n in _HYPERBAND_OWN]
    if own:
        raise ConfigError(
            "%s: Katib's hyperband sets a trial's steps itself (%s evaluations of "
            "--eval-every %d steps); take %s out of the space."
            % (space.source, RESOURCE, eval_every, ", ".join(own)))
    for p in space.parameters:
        if p.type == "discrete" and not all(isinstance(v, int) for v in p.values):
            raise ConfigError(
                "%s: Katib's hyperband (v0.19.0) reads discrete values as whole numbers; "
                "parameter %r has %s. Make it type: categorical (train reads the text), or "
                "use another --algorithm."
                % (space.source, p.name, ", ".join(space_lib.format_value(v)
                                                   for v in p.values)))
    if pruner != "none":
        raise UsageError(
            "--pruner %s with Katib's hyperband: hyperband moves on only when every trial "
            "of a rung succeeded, and an early-stopped trial has not (v0.19.0), so the "
            "Experiment would wait forever. Leave --pruner out: hyperband drops the weak "
            "configurations itself." % pruner)
    if study.parallel_trials < evaluations:
        raise UsageError(
            "--parallel-trials %d: Katib's hyperband here starts %d configurations at once "
            "(one per evaluation of --max-steps %d at --eval-every %d: eta %d), and it "
            "refuses a parallelTrialCount below that. Give --parallel-trials %d (or more) "
            "and --max-trials %d, or raise --eval-every for fewer."
            % (study.parallel_trials, evaluations, max_steps, eval_every, evaluations,
               evaluations, evaluations + 1))
    if study.max_trials != study.parallel_trials + 1:
        raise UsageError(
            "--max-trials %d: Katib's hyperband (v0.19.0) can finish %d trials here: "
            "--parallel-trials %d configurations trained to the first evaluation, then the "
            "best of them trained --max-steps %d. Past that its suggestion service answers "
            "fewer trials than Katib's controller asks for, and the Experiment would wait "
            "forever. Give --max-trials %d."
            % (study.max_trials, study.parallel_trials + 1, study.parallel_trials, max_steps,
               study.parallel_trials + 1))


def check_rules(study: space_lib.Study, algorithm: str, *, pruner: str = "none",
                seed: Optional[int] = None, max_steps: Optional[int] = None,
                eval_every: int = 1) -> Optional[int]:
    """What Katib v0.19.0 refuses, or accepts and cannot finish, for ``study``
    run by ``algorithm``: a UsageError (a ConfigError for the space file) that
    names the setting to change. Returns hyperband's evaluations (else None)."""
    if algorithm not in ALGORITHMS:
        raise UsageError("--algorithm for Katib is one of %s; got %r."
                         % (", ".join(ALGORITHMS), algorithm))
    name = ALGORITHMS[algorithm]
    if study.parallel_trials > study.max_trials:
        raise UsageError(
            "--parallel-trials %d is more than --max-trials %d: Katib refuses an Experiment "
            "whose parallelTrialCount exceeds its maxTrialCount (its validating webhook, "
            "v0.19.0). Lower --parallel-trials or raise --max-trials."
            % (study.parallel_trials, study.max_trials))
    if seed is not None and name in _SEEDED and (isinstance(seed, bool) or seed < 0):
        raise UsageError("Katib's %s takes a seed (random_state) >= 0; got %r." % (name, seed))
    for p in study.space.parameters:
        bad = [v for v in p.values or () if set("'\\\"") & set(str(v))]
        if p.type == "categorical" and bad:
            raise ConfigError(
                "%s: parameter %r: the value %r holds a quote or a backslash, which Katib's "
                "trial command cannot carry (Katib writes each value into the command's "
                "text). Use another value." % (study.space.source, p.name, bad[0]))
    _scale_rules(study.space, name)
    if name == "grid":
        _grid_rules(study)
    if name == "cmaes":
        numeric = [p.name for p in study.space.parameters if p.type in ("double", "integer")]
        if len(numeric) < 2:
            raise ConfigError(
                "%s: Katib's cmaes (its goptuna service, v0.19.0) needs two or more double "
                "or integer parameters; this space has %d%s. Use --algorithm tpe or random."
                % (study.space.source, len(numeric),
                   " (%s)" % ", ".join(numeric) if numeric else ""))
    if name != "hyperband":
        return None
    evaluations = hyperband_plan(max_steps, eval_every)
    _hyperband_rules(study, pruner, evaluations, max_steps, eval_every)
    return evaluations


def _algorithm(name: str, seed: Optional[int], evaluations: Optional[int]) -> Dict[str, Any]:
    spec: Dict[str, Any] = {"algorithmName": name}
    settings = []
    if name == "hyperband":
        settings += [{"name": "resource_name", "value": RESOURCE},
                     {"name": "eta", "value": str(evaluations)},
                     {"name": "r_l", "value": "%d.5" % evaluations}]
    elif seed is not None and name in _SEEDED:
        settings.append({"name": "random_state", "value": str(seed)})
    if settings:
        spec["algorithmSettings"] = settings
    return spec


def _describe(name: str) -> str:
    if name == RESOURCE:
        return "hyperband's resource: evaluations the trial trains"
    return "%s (the search space's)" % name


def _drop_flag(command: List[str], flag: str) -> None:
    if flag in command:
        at = command.index(flag)
        del command[at:at + 2]


def build_experiment(spec: JobSpec, study: space_lib.Study, image: Optional[str] = None, *,
                     algorithm: str = DEFAULT_ALGORITHM, pruner: str = "none",
                     seed: Optional[int] = None, eval_every: int = 1,
                     max_steps: Optional[int] = None, namespace: Optional[str] = None,
                     max_failed: Optional[int] = None) -> Dict[str, Any]:
    """The ``Experiment`` that runs ``study`` with trials of ``spec``'s ``train``,
    each ``eval_every`` steps evaluating; refused (:func:`check_rules`) where
    Katib would refuse it or could not finish it."""
    study.validate()
    if spec.workers or spec.ps or spec.evaluator:
        raise UsageError("--target katib runs each trial as one pod (a batch/v1 Job); "
                         "--workers, --ps and --evaluator do not apply. Tune on one "
                         "machine a trial, or use Vertex AI (--target vertex) for "
                         "distributed trials.")
    evaluations = check_rules(study, algorithm, pruner=pruner, seed=seed,
                              max_steps=max_steps, eval_every=eval_every)
    name = ALGORITHMS[algorithm]
    image, command, gpus = job_program(spec, image, "Never", "Katib trial")
    model_dir = command.index("--model-dir") + 1
    command[model_dir] = "%s/trials/${trialSpec.Name}" % spec.job_dir.rstrip("/")
    names = list(study.space.names)
    params = parameters(study.space)
    command += ["--tuning-trial", "--print-evaluations"]
    command += ["--%s=${trialParameters.%s}" % (n, n) for n in names]
    if max_failed is not None and not 0 <= max_failed <= study.max_trials:
        raise UsageError("max_failed must be from 0 to --max-trials %d, as Katib's validator "
                         "wants; got %r." % (study.max_trials, max_failed))
    if evaluations:
        params.append({"name": RESOURCE, "parameterType": "int",
                       "feasibleSpace": {"min": "1", "max": str(evaluations)}})
        names.append(RESOURCE)
        for flag in ("--max-steps", "--eval-every"):  # flags beat --hparams
            _drop_flag(command, flag)
        # A rung whose trials did not all succeed stops hyperband: fail at once.
        max_failed = 0 if max_failed is None else max_failed
    # Quoted: Katib substitutes the values into the text, and sh unquotes them.
    script = shlex.join(command)
    if evaluations:
        script += " --eval-every %d --max-steps $((${trialParameters.%s} * %d))" % (
            eval_every, RESOURCE, eval_every)
    container: Dict[str, Any] = {"name": CONTAINER, "image": image,
                                 "command": ["sh", "-c", script]}
    container.update(gpu_limits(gpus))
    experiment_spec: Dict[str, Any] = {
        "objective": {"type": "maximize" if study.resolved_goal == "max" else "minimize",
                      "objectiveMetricName": study.metric},
        "algorithm": _algorithm(name, seed, evaluations),
        "parallelTrialCount": study.parallel_trials,
        "maxTrialCount": study.max_trials,
        "maxFailedTrialCount": max_failed if max_failed is not None else study.max_trials,
        "parameters": params,
        "metricsCollectorSpec": {"collector": {"kind": "StdOut"}},
        "trialTemplate": {
            "primaryContainerName": CONTAINER,
            "trialParameters": [{"name": n, "reference": n, "description": _describe(n)}
                                for n in names],
            "trialSpec": {"apiVersion": "batch/v1", "kind": "Job",
                          "spec": {"template": {"spec": {"containers": [container],
                                                         "restartPolicy": "Never"}}}},
        },
    }
    if pruner != "none":
        experiment_spec["earlyStopping"] = {"algorithmName": "medianstop"}
    return {"apiVersion": API_VERSION, "kind": "Experiment",
            "metadata": job_metadata(spec, namespace, NAME_LENGTH), "spec": experiment_spec}


def check(experiment: Dict[str, Any]) -> None:
    """Validates ``experiment`` with Katib's API models (ConfigError naming
    the field); UsageError when the models are not installed."""
    try:
        from kubeflow_katib_api import models  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise UsageError("checking a Katib Experiment needs Katib's API models (%s): pip "
                         "install -e '.[tune]' (kubeflow-katib-api)." % e) from None
    try:
        parsed = models.V1beta1Experiment.from_dict(experiment)
    except Exception as e:  # pydantic's ValidationError names the field
        raise ConfigError("the Katib Experiment does not pass Katib's API models: %s" % e
                          ) from None
    lost = round_trip_losses(experiment, parsed.to_dict(), values=False)
    if lost:
        raise ConfigError("the Katib Experiment has fields Katib's API models do not know: "
                          "%s." % ", ".join(lost))
