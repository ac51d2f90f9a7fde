"""A hyperparameter search space in Vertex AI's vocabulary, and a study over it.

The space file is YAML mapping each hyperparameter (a key ``--hparams``
accepts) to its range::

    learning_rate: {type: double, min: 0.0001, max: 0.01, scale: log}
    batch_size: {type: integer, min: 64, max: 256}
    dropout: {type: discrete, values: [0.25, 0.5]}
    optimizer: {type: categorical, values: [adam, rmsprop]}

``scale`` is ``linear`` (the default) or ``log``; categorical parameters take
no scale. :func:`load_space` reads and checks it (a :class:`ConfigError`
names the file, the parameter and the key at fault). A :class:`Study` adds
the metric, its goal, the algorithm and the trial counts: local ``tune``
samples trial values from it (:meth:`SearchSpace.trial_values`, the same
values for the same seed), and ``submit --tune`` turns it into the
``studySpec`` of a Vertex ``HyperparameterTuningJob`` (:meth:`Study.study_spec`).
TF-free.

Field names and rules follow Vertex AI's StudySpec reference (read 2026):

* ``ParameterSpec`` (``parameterId``; one of ``doubleValueSpec``,
  ``integerValueSpec`` with ``minValue``/``maxValue``, ``discreteValueSpec``,
  ``categoricalValueSpec`` with ``values``; ``scaleType`` UNIT_LINEAR_SCALE or
  UNIT_LOG_SCALE, unset for categorical):
  https://cloud.google.com/vertex-ai/docs/reference/rest/v1/StudySpec#ParameterSpec
* ``MetricSpec`` (``metricId``, ``goal`` MAXIMIZE or MINIMIZE) and
  ``Algorithm`` (GRID_SEARCH needs every parameter INTEGER, CATEGORICAL or
  DISCRETE; RANDOM_SEARCH; ALGORITHM_UNSPECIFIED is Vertex's own default):
  https://cloud.google.com/vertex-ai/docs/reference/rest/v1/StudySpec
* how trials receive values (command-line arguments named after the
  parameters): https://cloud.google.com/vertex-ai/docs/training/using-hyperparameter-tuning
"""

import dataclasses
import itertools
import math
import random
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import yaml

from estimator_keras import io
from estimator_keras.errors import ConfigError, closest

TYPES = ("double", "integer", "discrete", "categorical")
SCALES = {"linear": "UNIT_LINEAR_SCALE", "log": "UNIT_LOG_SCALE"}
ALGORITHMS = {"grid": "GRID_SEARCH", "random": "RANDOM_SEARCH", None: "ALGORITHM_UNSPECIFIED"}
GOALS = {"max": "MAXIMIZE", "min": "MINIMIZE"}
DEFAULT_RANDOM_TRIALS = 10

_KEYS = {"double": ("type", "min", "max", "scale"),
         "integer": ("type", "min", "max", "scale"),
         "discrete": ("type", "values", "scale"),
         "categorical": ("type", "values")}
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_METRIC_RE = re.compile(r"^[A-Za-z0-9_./-]+$")
# Metric names that are better when lower, for the default --goal.
_LOWER_IS_BETTER = re.compile(r"(^|_)(loss|error|mse|mae|rmse)($|_)")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One hyperparameter's range."""

    name: str
    type: str
    min: Optional[float] = None
    max: Optional[float] = None
    values: Optional[Tuple[Any, ...]] = None
    scale: str = "linear"

    def grid(self) -> List[Any]:
        """Every value a grid search takes (doubles have no grid)."""
        if self.type == "integer":
            return list(range(int(self.min), int(self.max) + 1))
        if self.type in ("discrete", "categorical"):
            return list(self.values)
        raise ConfigError("parameter %r is a double: a grid search needs integer, "
                          "discrete or categorical parameters." % self.name)

    def sample(self, rng: random.Random) -> Any:
        """A value drawn from the range with ``rng`` (log scale: uniform in log)."""
        if self.type in ("discrete", "categorical"):
            return self.values[rng.randrange(len(self.values))]
        low, high = float(self.min), float(self.max)
        if self.scale == "log":
            value = math.exp(rng.uniform(math.log(low), math.log(high)))
        else:
            value = rng.uniform(low, high)
        if self.type == "integer":
            return min(int(self.max), max(int(self.min), int(round(value))))
        # Six significant digits: the value in the table is the value passed on.
        return min(high, max(low, float("%.6g" % value)))

    def representative_values(self) -> List[Any]:
        """Values that exercise every end of the range (for checking types)."""
        return list(self.values) if self.values is not None else [self.min, self.max]

    def to_study(self) -> Dict[str, Any]:
        """Vertex's ``ParameterSpec`` for this parameter."""
        spec: Dict[str, Any] = {"parameterId": self.name}
        if self.type == "double":
            spec["doubleValueSpec"] = {"minValue": float(self.min), "maxValue": float(self.max)}
        elif self.type == "integer":
            spec["integerValueSpec"] = {"minValue": int(self.min), "maxValue": int(self.max)}
        elif self.type == "discrete":
            # Vertex wants the values in increasing order.
            spec["discreteValueSpec"] = {"values": sorted(float(v) for v in self.values)}
        else:
            spec["categoricalValueSpec"] = {"values": [str(v) for v in self.values]}
        if self.type != "categorical":
            spec["scaleType"] = SCALES[self.scale]
        return spec

    def to_dict(self) -> Dict[str, Any]:
        """The parameter as the space file writes it."""
        out: Dict[str, Any] = {"type": self.type}
        if self.values is not None:
            out["values"] = list(self.values)
        else:
            out["min"], out["max"] = self.min, self.max
        if self.type != "categorical":
            out["scale"] = self.scale
        return out


def format_value(value: Any) -> str:
    """A trial value as ``--hparams`` and command-line arguments take it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """The parameters of a study, in the order of the space file."""

    parameters: Tuple[Parameter, ...]
    source: str = "search space"

    @property
    def names(self) -> List[str]:
        return [p.name for p in self.parameters]

    def check_algorithm(self, algorithm: Optional[str]) -> None:
        if algorithm not in ALGORITHMS:
            raise ConfigError("--algorithm must be grid or random; got %r." % (algorithm,))
        if algorithm == "grid":
            doubles = [p.name for p in self.parameters if p.type == "double"]
            if doubles:
                raise ConfigError(
                    "%s: a grid search needs integer, discrete or categorical parameters "
                    "(as Vertex AI's GRID_SEARCH does); %s %s double. Use --algorithm "
                    "random, or list the values with type: discrete."
                    % (self.source, ", ".join(doubles), "is" if len(doubles) == 1 else "are"))

    def grid(self) -> List[Dict[str, Any]]:
        """Every combination, the first parameter varying slowest."""
        self.check_algorithm("grid")
        return [dict(zip(self.names, combo))
                for combo in itertools.product(*(p.grid() for p in self.parameters))]

    def grid_size(self) -> int:
        return math.prod(len(p.grid()) for p in self.parameters)

    def trial_values(self, trial: int, seed: int = 0,
                     algorithm: Optional[str] = "random") -> Dict[str, Any]:
        """The values of trial number ``trial`` (1-based).

        Random: drawn from a generator seeded by ``seed`` and the trial number
        alone, so a trial gets the same values whichever trials ran before it.
        Grid: the ``trial``-th combination of :meth:`grid`.
        """
        if not isinstance(trial, int) or trial < 1:
            raise ValueError("trial numbers start at 1; got %r" % (trial,))
        if algorithm == "grid":
            combos = self.grid()
            if trial > len(combos):
                raise ConfigError("%s: the grid has %d combinations; there is no trial %d."
                                  % (self.source, len(combos), trial))
            return combos[trial - 1]
        # A str seed is hashed with SHA-512 by random.seed: the same on every run.
        rng = random.Random("%s:%d" % (seed, trial))
        return {p.name: p.sample(rng) for p in self.parameters}

    def study_parameters(self) -> List[Dict[str, Any]]:
        return [p.to_study() for p in self.parameters]

    def to_dict(self) -> Dict[str, Any]:
        return {p.name: p.to_dict() for p in self.parameters}

    def check_hparams(self, apply: Callable[[Dict[str, str]], Any]) -> None:
        """Calls ``apply({name: text})`` with each end of every range, as
        ``--hparams`` would pass it; a ConfigError it raises (an unknown
        hyperparameter, a value of the wrong type) is re-raised naming this file."""
        for parameter in self.parameters:
            for value in parameter.representative_values():
                try:
                    apply({parameter.name: format_value(value)})
                except ConfigError as e:
                    raise ConfigError("%s: parameter %r (value %s): %s"
                                      % (self.source, parameter.name, format_value(value),
                                         getattr(e, "message", None) or e)) from e


def _did_you_mean(name: Any, choices: Any) -> str:
    close = closest(name, choices)
    return " (did you mean %s?)" % close if close else ""


def _parse_parameter(name: Any, body: Any, source: str) -> Parameter:
    where = "%s: parameter %r" % (source, name)
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ConfigError("%s: hyperparameter names are identifiers such as learning_rate; "
                          "got %r." % (source, name))
    if not isinstance(body, Mapping):
        raise ConfigError("%s must map to {type: ..., ...}, for example {type: double, "
                          "min: 0.0001, max: 0.01, scale: log}; got %r." % (where, body))
    kind = body.get("type")
    if "type" not in body:
        # A misspelt key (tpye:) leaves the type out: name that key.
        keys = sorted({k for keys in _KEYS.values() for k in keys})
        unknown = [k for k in body if k not in keys]
        raise ConfigError("%s: %sno type; expected type: one of %s."
                          % (where, "".join("unknown key %r%s and " % (k, _did_you_mean(k, keys))
                                            for k in unknown[:1]), ", ".join(TYPES)))
    if kind not in TYPES:
        raise ConfigError("%s: unknown type %r%s; expected one of %s."
                          % (where, kind, _did_you_mean(kind, TYPES), ", ".join(TYPES)))
    unknown = [k for k in body if k not in _KEYS[kind]]
    if unknown:
        raise ConfigError("%s: unknown key %r%s for type %s; its keys are %s."
                          % (where, unknown[0], _did_you_mean(unknown[0], _KEYS[kind]), kind,
                             ", ".join(_KEYS[kind])))
    scale = body.get("scale", "linear")
    if scale not in SCALES:
        raise ConfigError("%s: unknown scale %r; expected linear or log." % (where, scale))
    if kind in ("double", "integer"):
        for key in ("min", "max"):
            if key not in body:
                raise ConfigError("%s: a %s needs %s." % (where, kind, key))
            value = body[key]
            ok = (isinstance(value, int) and not isinstance(value, bool)) if kind == "integer" \
                else _is_number(value)
            if not ok:
                raise ConfigError("%s: %s must be %s; got %r."
                                  % (where, key, "a whole number" if kind == "integer"
                                     else "a number", value))
        low, high = body["min"], body["max"]
        if not low < high:
            raise ConfigError("%s: min (%r) must be below max (%r)." % (where, low, high))
        if scale == "log" and low <= 0:
            raise ConfigError("%s: a log scale needs min > 0; got %r." % (where, low))
        return Parameter(name, kind, min=low if kind == "integer" else float(low),
                         max=high if kind == "integer" else float(high), scale=scale)
    values = body.get("values")
    if not isinstance(values, list) or not values:
        raise ConfigError("%s: a %s needs values: a non-empty list." % (where, kind))
    if kind == "discrete":
        bad = [v for v in values if not _is_number(v)]
        if bad:
            raise ConfigError("%s: discrete values must be numbers; got %r (use type: "
                              "categorical for words)." % (where, bad[0]))
        if scale == "log" and min(values) <= 0:
            raise ConfigError("%s: a log scale needs values > 0." % where)
    else:
        bad = [v for v in values if not isinstance(v, (str, int, float, bool))]
        if bad:
            raise ConfigError("%s: categorical values must be words or numbers; got %r."
                              % (where, bad[0]))
        values = [format_value(v) for v in values]
    if len(set(values)) != len(values):
        raise ConfigError("%s: values repeat: %r." % (where, values))
    return Parameter(name, kind, values=tuple(values), scale=scale)


def parse_space(data: Any, source: str = "search space") -> SearchSpace:
    """A :class:`SearchSpace` from the loaded YAML mapping ``data``."""
    if not isinstance(data, Mapping) or not data:
        raise ConfigError("%s must map hyperparameter names to ranges, for example "
                          "learning_rate: {type: double, min: 0.0001, max: 0.01, scale: log}; "
                          "got %r." % (source, data))
    return SearchSpace(tuple(_parse_parameter(k, v, source) for k, v in data.items()), source)


def load_space(path: str) -> SearchSpace:
    """Reads and checks the YAML search space at ``path`` (local or ``gs://``)."""
    try:
        text = io.read_text(path)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("Cannot read the search space %s: %s." % (path, e)) from e
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError("The search space %s is not valid YAML: %s" % (path, e)) from e
    return parse_space(data, source=str(path))


def default_goal(metric: str) -> str:
    """``min`` for loss-like metric names (loss, val_loss, mean_error...), else ``max``."""
    return "min" if _LOWER_IS_BETTER.search(metric.lower()) else "max"


@dataclasses.dataclass
class Study:
    """What a tuning run asks for: the space, the metric and how to search it.

    ``goal`` None takes :func:`default_goal`; ``algorithm`` None is Vertex's own
    default algorithm on Vertex and random search locally.
    """

    space: SearchSpace
    metric: str = "accuracy"
    goal: Optional[str] = None
    algorithm: Optional[str] = None
    max_trials: int = DEFAULT_RANDOM_TRIALS
    parallel_trials: int = 1

    def validate(self) -> None:
        if not isinstance(self.metric, str) or not _METRIC_RE.match(self.metric):
            raise ConfigError("--metric must name an evaluation metric such as accuracy or "
                              "loss; got %r." % (self.metric,))
        if self.goal not in (None, "max", "min"):
            raise ConfigError("--goal must be max or min; got %r." % (self.goal,))
        self.space.check_algorithm(self.algorithm)
        for name in ("max_trials", "parallel_trials"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError("--%s must be a whole number >= 1; got %r."
                                  % (name.replace("_", "-"), value))

    @property
    def resolved_goal(self) -> str:
        return self.goal or default_goal(self.metric)

    def study_spec(self) -> Dict[str, Any]:
        """Vertex's ``StudySpec``: metrics, parameters and algorithm."""
        self.validate()
        return {"metrics": [{"metricId": self.metric, "goal": GOALS[self.resolved_goal]}],
                "parameters": self.space.study_parameters(),
                "algorithm": ALGORITHMS[self.algorithm]}
