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
  sequence in Katib). Katib's Hyperband tunes the steps itself: it needs a
  resource parameter, here ``max_steps`` (an int from the first evaluation to
  ``--max-steps``), added to the space.
* **Early stopping**: any ``--pruner`` becomes Katib's ``medianstop``.
* **Metrics**: each trial runs ``train --print-evaluations``, whose
  ``accuracy=0.8123 loss=0.4321`` lines Katib's StdOut collector parses at
  every evaluation (what ``medianstop`` judges).
* **Trial**: ``train --tuning-trial`` with ``--NAME=${trialParameters.NAME}``
  arguments (they become ``--hparams``, as on Vertex), in its own model dir,
  ``JOB_DIR/trials/${trialSpec.Name}``.

:func:`check` validates the object with the ``kubeflow-katib-api`` models
(the tune extra): a field they drop (a typo, a field of another version) is
an error, which a loose schema check would let through. TF-free.
"""

from typing import Any, Dict, List, Optional

from estimator_keras.cloud import space as space_lib
from estimator_keras.cloud.spec import JobSpec
from estimator_keras.cloud.tfjob import gpu_limits, job_metadata, job_program, round_trip_losses
from estimator_keras.errors import ConfigError, UsageError

API_VERSION = "kubeflow.org/v1beta1"
ALGORITHMS = {"tpe": "tpe", "cmaes": "cmaes", "random": "random", "grid": "grid",
              "qmc": "sobol", "sobol": "sobol", "bayesianoptimization": "bayesianoptimization",
              "hyperband": "hyperband"}
DEFAULT_ALGORITHM = "tpe"
CONTAINER = "training-container"
_TYPES = {"double": "double", "integer": "int", "discrete": "discrete",
          "categorical": "categorical"}
RESOURCE = "max_steps"


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


def _algorithm(study: space_lib.Study, algorithm: str, seed: Optional[int],
               first_step: int, max_steps: Optional[int]) -> Dict[str, Any]:
    if algorithm not in ALGORITHMS:
        raise UsageError("--algorithm for Katib is one of %s; got %r."
                         % (", ".join(ALGORITHMS), algorithm))
    name = ALGORITHMS[algorithm]
    spec: Dict[str, Any] = {"algorithmName": name}
    settings = []
    if name == "grid":
        study.space.check_algorithm("grid")
    if name == "hyperband":
        if not max_steps:
            raise UsageError("Katib's hyperband needs --max-steps: the most steps a trial "
                             "trains (its resource, from the first evaluation up).")
        settings += [{"name": "resource_name", "value": RESOURCE},
                     {"name": "eta", "value": "3"},
                     {"name": "r_l", "value": str(max_steps)}]
    elif seed is not None and name in ("tpe", "random", "cmaes", "bayesianoptimization"):
        settings.append({"name": "random_state", "value": str(seed)})
    if settings:
        spec["algorithmSettings"] = settings
    return spec


def build_experiment(spec: JobSpec, study: space_lib.Study, image: Optional[str] = None, *,
                     algorithm: str = DEFAULT_ALGORITHM, pruner: str = "none",
                     seed: Optional[int] = None, first_step: int = 1,
                     max_steps: Optional[int] = None, namespace: Optional[str] = None,
                     max_failed: Optional[int] = None) -> Dict[str, Any]:
    """The ``Experiment`` that runs ``study`` with trials of ``spec``'s ``train``."""
    study.validate()
    if spec.workers or spec.ps or spec.evaluator:
        raise UsageError("--target katib runs each trial as one pod (a batch/v1 Job); "
                         "--workers, --ps and --evaluator do not apply. Tune on one "
                         "machine a trial, or use Vertex AI (--target vertex) for "
                         "distributed trials.")
    image, command, gpus = job_program(spec, image, "Never", "Katib trial")
    model_dir = command.index("--model-dir") + 1
    command[model_dir] = "%s/trials/${trialSpec.Name}" % spec.job_dir.rstrip("/")
    names = list(study.space.names)
    params = parameters(study.space)
    algo = _algorithm(study, algorithm, seed, first_step, max_steps)
    if algo["algorithmName"] == "hyperband":
        if RESOURCE in names:
            raise ConfigError("%s: Katib's hyperband sets %s itself (its resource); take it "
                              "out of the space." % (study.space.source, RESOURCE))
        params.append({"name": RESOURCE, "parameterType": "int",
                       "feasibleSpace": {"min": str(max(1, first_step)),
                                         "max": str(max_steps)}})
        names.append(RESOURCE)
        if "--max-steps" in command:  # the trial's value wins
            at = command.index("--max-steps")
            del command[at:at + 2]
    command += ["--tuning-trial", "--print-evaluations"]
    command += ["--%s=${trialParameters.%s}" % (n, n) for n in names]
    container: Dict[str, Any] = {"name": CONTAINER, "image": image, "command": command}
    container.update(gpu_limits(gpus))
    experiment_spec: Dict[str, Any] = {
        "objective": {"type": "maximize" if study.resolved_goal == "max" else "minimize",
                      "objectiveMetricName": study.metric},
        "algorithm": algo,
        "parallelTrialCount": study.parallel_trials,
        "maxTrialCount": study.max_trials,
        "maxFailedTrialCount": max_failed if max_failed is not None else study.max_trials,
        "parameters": params,
        "metricsCollectorSpec": {"collector": {"kind": "StdOut"}},
        "trialTemplate": {
            "primaryContainerName": CONTAINER,
            "trialParameters": [{"name": n, "reference": n,
                                 "description": "%s (the search space's)" % n} for n in names],
            "trialSpec": {"apiVersion": "batch/v1", "kind": "Job",
                          "spec": {"template": {"spec": {"containers": [container],
                                                         "restartPolicy": "Never"}}}},
        },
    }
    if pruner != "none":
        experiment_spec["earlyStopping"] = {"algorithmName": "medianstop"}
    return {"apiVersion": API_VERSION, "kind": "Experiment",
            "metadata": job_metadata(spec, namespace), "spec": experiment_spec}


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
