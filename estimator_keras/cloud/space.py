"""Deprecated: the search space is :mod:`estimator_keras.tuning.space`; this
name stays for code that imported it from here."""

import warnings

from estimator_keras.tuning.space import (  # noqa: F401  pylint: disable=unused-import
    ALGORITHMS, DEFAULT_RANDOM_TRIALS, GOALS, SCALES, TYPES, Parameter, SearchSpace, Study,
    default_goal, format_value, load_space, parse_space)

warnings.warn("estimator_keras.cloud.space moved to estimator_keras.tuning.space",
              DeprecationWarning, stacklevel=2)
