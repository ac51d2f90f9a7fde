"""Markdown tables from a results JSON, for BENCHMARKS.md.

Example::

    python -m benchmarks.report benchmarks/results/latest.json > tables.md
"""

import json
import sys

from benchmarks.common import fmt

RATIO_COLUMNS = ("ratio", "ratio_best")


def _cell(column, value):
    if column in RATIO_COLUMNS and isinstance(value, (int, float)):
        return f"{value:.2f}x"
    if isinstance(value, float) and abs(value) < 1:
        return f"{value:.4f}"
    return fmt(value) if isinstance(value, float) or value is None else str(value)


def table_markdown(result):
    """One table result as Markdown: the rows, then the targets."""
    lines = []
    unit = result.get("unit", "")
    columns = result.get("columns") or ["name", "median", "min", "max", "ratio"]
    header = [f"median {unit}".strip() if c == "median" else c for c in columns]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(" --- " for _ in columns) + "|")
    for row in result.get("rows", []):
        cells = [_cell(c, row.get(c)) for c in columns]
        if row.get("error"):
            cells[-1] += f" (error: {row['error'][:60]})"
        lines.append("| " + " | ".join(cells) + " |")
    if result.get("targets"):
        lines.append("")
        lines.append("| target | value | need | met |")
        lines.append("| --- | --- | --- | --- |")
        for t in result["targets"]:
            state = {True: "**met**", False: "**not met**", None: "n/a"}[t["met"]]
            value = "-" if t["value"] is None else (
                f"{t['value']:,.0f}" if abs(t["value"]) >= 1000 else f"{t['value']:.3f}")
            lines.append(f"| {t['description']} | {value} | {t['op']} {t['threshold']} "
                         f"| {state} |")
    return "\n".join(lines)


def main(argv=None):
    argv = argv if argv is not None else sys.argv[1:]
    if len(argv) != 1:
        sys.stderr.write("usage: python -m benchmarks.report RESULTS.json\n")
        return 2
    with open(argv[0]) as f:
        results = json.load(f)
    for name, result in results["tables"].items():
        print(f"### {name}: {result.get('title', '')}\n")
        if "rows" in result:
            print(table_markdown(result))
        else:
            print(f"error: {result.get('error')}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
