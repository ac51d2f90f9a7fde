"""How a local study searches: a search space as Optuna distributions, and
the sampler and pruner each ``tune --algorithm`` and ``--pruner`` names.

The space file keeps Vertex AI's vocabulary (:mod:`estimator_keras.tuning.space`);
here each parameter becomes an Optuna distribution:

=========================  =========================================
space                      Optuna
=========================  =========================================
double, linear / log       ``FloatDistribution(min, max, log=...)``
integer, linear / log      ``IntDistribution(min, max, log=...)``
discrete (numbers)         ``CategoricalDistribution(values)``
categorical (words)        ``CategoricalDistribution(values)``
=========================  =========================================

A sampler that cannot search a kind of parameter is refused with the reason
rather than left to fall back to random values without a word: CMA-ES and
quasi-Monte Carlo sample only numeric ranges (Optuna hands categorical ones to
an independent random sampler), CMA-ES needs two of them or more (one range
has no covariance to learn, and Katib's CMA-ES refuses it), and a grid needs
finite values.

Optuna is an extra (``pip install -e '.[tune]'``); :func:`optuna` imports it
or says how to install it.
"""

import importlib
from typing import Dict, List, Optional

from estimator_keras.errors import ConfigError, UsageError
from estimator_keras.tuning import space as space_lib

ALGORITHMS = ("tpe", "cmaes", "qmc", "random", "grid")
DEFAULT_ALGORITHM = "tpe"
PRUNERS = ("median", "hyperband", "asha", "none")
DEFAULT_PRUNER = "none"
# Trials drawn at random before TPE models the results (Optuna's default is
# 10): a study of a few dozen trials spends fewer of them blind.
TPE_STARTUP_TRIALS = 5
# The median pruner judges no trial before this many have finished.
MEDIAN_STARTUP_TRIALS = 4
# Successive halving and Hyperband keep a third of the trials at each rung.
REDUCTION_FACTOR = 3
_NUMERIC_ONLY = {"cmaes": "CMA-ES", "qmc": "quasi-Monte Carlo (QMC)"}


def optuna():
    """The ``optuna`` module, or a UsageError saying which extra brings it."""
    try:
        module = importlib.import_module("optuna")
    except ImportError as e:
        raise UsageError(
            f"tune needs Optuna, which is not installed ({e}). Install the tune extra: pip "
            f"install -e '.[tune]' (Optuna, its database drivers and plots).") from None
    # tune says what happens in its own lines; Optuna's are for its warnings.
    module.logging.set_verbosity(module.logging.WARNING)
    return module


def distributions(space: space_lib.SearchSpace) -> Dict[str, object]:
    """Each parameter of ``space`` as an Optuna distribution, in file order."""
    dist = optuna().distributions
    out = {}
    for p in space.parameters:
        log = p.scale == "log"
        if p.type == "double":
            out[p.name] = dist.FloatDistribution(float(p.min), float(p.max), log=log)
        elif p.type == "integer":
            out[p.name] = dist.IntDistribution(int(p.min), int(p.max), log=log)
        else:
            out[p.name] = dist.CategoricalDistribution(list(p.values))
    return out


def check_algorithm(space: space_lib.SearchSpace, algorithm: str) -> None:
    """Refuses an algorithm the space's parameters do not allow, saying why."""
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"--algorithm must be one of {', '.join(ALGORITHMS)}; got "
                          f"{algorithm!r}.")
    if algorithm == "grid":
        space.check_algorithm("grid")
    elif algorithm in _NUMERIC_ONLY:
        listed = [p.name for p in space.parameters if p.type in ("discrete", "categorical")]
        if listed:
            raise ConfigError(
                f"{space.source}: {_NUMERIC_ONLY[algorithm]} searches numeric ranges only; "
                f"{', '.join(listed)} {'is' if len(listed) == 1 else 'are'} a list of values, "
                f"which Optuna would draw at random beside it. Use --algorithm tpe (any "
                f"parameters), or give {'it' if len(listed) == 1 else 'them'} as type: integer "
                f"or double ranges.")
        ranges = [p.name for p in space.parameters]
        if algorithm == "cmaes" and len(ranges) < 2:
            raise ConfigError(
                f"{space.source}: CMA-ES needs two or more numeric ranges (double or integer) "
                f"to adapt a covariance between them; the space has {len(ranges)}"
                f"{': ' + ranges[0] if ranges else ''}. Use "
                f"--algorithm tpe or qmc, or add a second range.")


def derived_seed(seed: int, trials: int) -> int:
    """The seed of the draw after ``trials`` trials of a study seeded ``seed``."""
    return (int(seed) * 1_000_003 + int(trials)) % (2 ** 32)


def sampler(space: space_lib.SearchSpace, algorithm: str, seed: Optional[int],
            parallel: int = 1):
    """The Optuna sampler ``algorithm`` names. ``seed`` None: Optuna seeds it
    itself, so workers sharing a study draw different values; a seed makes a
    study run by one ``tune`` command repeatable (give each worker its own)."""
    check_algorithm(space, algorithm)
    samplers = optuna().samplers
    if algorithm == "tpe":
        # With trials running at once, a running trial counts as its worst
        # case (constant liar), so parallel trials spread out.
        return samplers.TPESampler(seed=seed, n_startup_trials=TPE_STARTUP_TRIALS,
                                   multivariate=True, constant_liar=parallel > 1)
    if algorithm == "cmaes":
        return samplers.CmaEsSampler(seed=seed)
    if algorithm == "qmc":
        return samplers.QMCSampler(seed=seed, scramble=True)
    if algorithm == "random":
        return samplers.RandomSampler(seed=seed)
    grid: Dict[str, List[object]] = {p.name: p.grid() for p in space.parameters}

    class Grid(samplers.GridSampler):
        """Optuna's grid, asked for trial by trial: its ``after_trial`` stops
        ``Study.optimize`` once every point was drawn, which outside that loop
        is an error; ``--trials`` (at most the grid's size) ends the study."""

        def after_trial(self, study, trial, state, values):
            pass

    return Grid(grid, seed=seed)


def pruner(name: str, first_step: int, max_steps: int):
    """The Optuna pruner ``name`` names. Steps are the resource: a trial
    reports at every evaluation, from ``first_step`` (its first evaluation)
    to ``max_steps``."""
    pruners = optuna().pruners
    if name not in PRUNERS:
        raise ConfigError(f"--pruner must be one of {', '.join(PRUNERS)}; got {name!r}.")
    if name == "none":
        return pruners.NopPruner()
    if name == "median":
        return pruners.MedianPruner(n_startup_trials=MEDIAN_STARTUP_TRIALS)
    first = max(1, min(first_step, max_steps))
    if name == "asha":
        return pruners.SuccessiveHalvingPruner(min_resource=first,
                                               reduction_factor=REDUCTION_FACTOR)
    return pruners.HyperbandPruner(min_resource=first, max_resource=max(max_steps, first),
                                   reduction_factor=REDUCTION_FACTOR)
