"""PNG plots of a results JSON (matplotlib, the ``bench`` extra).

- ``accuracy-vs-time.png``: test accuracy against each run's working time,
  the accuracy table's runs (the project's and plain Keras's), with the 0.91
  line;
- ``input-examples-per-s.png``: the input table's examples/s per pipeline
  (median, with the min-max spread), log scale.

Example::

    python -m benchmarks.plots benchmarks/results/latest.json --out benchmarks/results
"""

import argparse
import json
import os
import sys

ACCURACY_PNG = "accuracy-vs-time.png"
INPUT_PNG = "input-examples-per-s.png"


def _pyplot():
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    return plt


def accuracy_vs_time(result, path, target=0.91):
    """Accuracy curves of the accuracy table's runs; returns ``path``."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for row in result.get("rows", []):
        curve = row.get("curve") or []
        if not curve:
            continue
        style = "--" if row["name"].startswith("keras") else "-"
        ax.plot([c["active_s"] for c in curve], [c["accuracy"] for c in curve], style,
                marker="o", markersize=3, label=row["name"])
    ax.axhline(target, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("working time of the run, s (TensorFlow import excluded)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"fashion_mnist_cnn: test accuracy against time ({target} dotted)")
    accuracies = [c["accuracy"] for r in result.get("rows", []) for c in r.get("curve") or []]
    if accuracies and max(accuracies) > 0.8:
        ax.set_ylim(max(0.8, min(accuracies) - 0.01), min(1.0, max(accuracies) + 0.01))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def input_rates(result, path):
    """Bar chart of the input table's pipelines; returns ``path``."""
    plt = _pyplot()
    rows = [r for r in result.get("rows", []) if r.get("median")]
    rows.sort(key=lambda r: r["median"])
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(rows) + 1.5), dpi=110)
    names = [r["name"] for r in rows]
    medians = [r["median"] for r in rows]
    low = [r["median"] - (r.get("min") or r["median"]) for r in rows]
    high = [(r.get("max") or r["median"]) - r["median"] for r in rows]
    colors = ["tab:orange" if "cache" in r["name"] else
              "tab:blue" if r.get("group") == "knob" else "tab:grey" for r in rows]
    ax.barh(names, medians, xerr=[low, high], color=colors, error_kw={"linewidth": 0.8})
    ax.set_xscale("log")
    ax.set_xlabel("examples/s (median over windows; bars: min-max), log scale")
    ax.set_title("input pipelines alone, batch 128 (cached pipelines in orange)")
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def write_plots(results, folder, prefix=""):
    """Every plot the results allow, into ``folder``; returns the paths
    written (and, without matplotlib, none: it says so on stderr)."""
    try:
        _pyplot()
    except ImportError:
        sys.stderr.write("matplotlib is not installed: no plots (pip install "
                         "-e '.[bench]' in the checkout)\n")
        return []
    os.makedirs(folder, exist_ok=True)
    tables, written = results.get("tables", {}), []
    if tables.get("accuracy", {}).get("rows"):
        written.append(accuracy_vs_time(tables["accuracy"],
                                        os.path.join(folder, prefix + ACCURACY_PNG)))
    if tables.get("input", {}).get("rows"):
        written.append(input_rates(tables["input"], os.path.join(folder, prefix + INPUT_PNG)))
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plots", allow_abbrev=False,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a results JSON of python -m benchmarks")
    parser.add_argument("--out", default=None, help="folder (default: the JSON's)")
    args = parser.parse_args(argv)
    with open(args.results) as f:
        results = json.load(f)
    folder = args.out or os.path.dirname(os.path.abspath(args.results))
    for path in write_plots(results, folder):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
