"""A study's plots beside its table, drawn by Optuna's matplotlib visualization:

* ``optimization_history.png``: each trial's metric and the best so far;
* ``param_importances.png``: how much each hyperparameter explains of the
  metric (Optuna's fANOVA evaluator; needs two finished trials);
* ``intermediate_values.png``: every trial's metric at each evaluation, where
  a pruned trial's line ends.

Each is written through a temporary name. A plot that cannot be drawn yet
(too few trials) is skipped with the reason; a missing matplotlib says which
extra brings it.
"""

import os
import warnings
from typing import Callable, List

from estimator_keras import io
from estimator_keras.tuning import optuna_search as search

PLOTS = ("optimization_history", "param_importances", "intermediate_values")


def write(study, folder: str, metric: str, say: Callable[[str], None]) -> List[str]:
    """Draws the plots of ``study`` into ``folder``; returns the files written
    (``say`` tells why one is not drawn)."""
    try:
        import matplotlib  # pylint: disable=import-outside-toplevel
        matplotlib.use("Agg")
        from matplotlib import pyplot  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        say(f"no plots: matplotlib is not installed ({e}); the tune extra brings it")
        return []
    optuna = search.optuna()
    plots = optuna.visualization.matplotlib
    done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    written = []
    for name in PLOTS:
        if name == "param_importances" and len(done) < 2:
            say("no parameter importances yet: they need two succeeded trials")
            continue
        if not done and name != "intermediate_values":
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Optuna marks these plots experimental
            try:
                axes = getattr(plots, f"plot_{name}")(study, target_name=metric) \
                    if name != "intermediate_values" else plots.plot_intermediate_values(study)
            except (ValueError, RuntimeError, ZeroDivisionError) as e:
                say(f"no {name.replace('_', ' ')} plot: {e}")
                continue
        figure = getattr(axes, "figure", None) or axes.flat[0].figure
        figure.set_size_inches(8, 5)
        figure.tight_layout()
        path = os.path.join(folder, f"{name}.png")
        staging = io.temporary_name(path) + ".png"
        figure.savefig(staging, dpi=100)
        pyplot.close(figure)
        os.replace(staging, path)
        written.append(path)
    return written
