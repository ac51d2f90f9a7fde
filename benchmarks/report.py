"""Markdown tables from a results JSON, for BENCHMARKS.md.

Example::

    python -m benchmarks.report benchmarks/results/latest.json > tables.md

Prints every target at a glance (met or not, and why), then each table:
its rows, its targets, and the extra tables some carry (the input table's
memory per epoch, the accuracy table's knobs). A table run in several rounds
(:mod:`benchmarks.rounds`) shows each round's ratio beside the median, and
each target's spread over the rounds (min / median / max); such a target is
met only when every round meets it.
"""

import json
import sys

from benchmarks.output import fmt, fmt_ratio, fmt_value, format_spread

RATIO_COLUMNS = ("ratio", "ratio_best")
STATE = {True: "**met**", False: "**not met**", None: "n/a"}


def _cell(column, value):
    if column in RATIO_COLUMNS and isinstance(value, (int, float)):
        return fmt_ratio(value)
    if column == "ratio_rounds" and isinstance(value, list):
        return ", ".join(fmt_ratio(v) for v in value)
    if isinstance(value, float) and abs(value) < 1:
        return f"{value:.4f}"
    return fmt(value) if isinstance(value, float) or value is None else str(value)


def rows_markdown(rows, columns, unit=""):
    header = [f"median {unit}".strip() if c == "median" else c for c in columns]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in columns) + "|"]
    for row in rows:
        cells = [_cell(c, row.get(c)) for c in columns]
        if row.get("error"):
            cells[-1] += f" (error: {row['error'][:60]})"
        if row.get("not_measured"):
            cells[-1] += f" (not measured: {row['not_measured'][:80]})"
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def targets_markdown(targets, table=None, spread=None):
    """Target rows; with ``spread`` (default: when a target has rounds) a
    column of min / median / max over the rounds."""
    if spread is None:
        spread = any(t.get("rounds") for t in targets)
    lines = ["| " + ("table | " if table else "") + "target | value | "
             + ("rounds: min / median / max | " if spread else "") + "need | met | why |",
             "| " + ("--- | " if table else "") + "--- | --- | " + ("--- | " if spread else "")
             + "--- | --- | --- |"]
    for t in targets:
        rounds = (f"{format_spread(t.get('spread'), t['threshold'], t['op'])} "
                  f"({len(t['rounds'])})" if t.get("rounds") else "-")
        lines.append("| " + (f"{table} | " if table else "") +
                     f"{t['description']} | {fmt_value(t['value'], t['threshold'], t['op'])} | "
                     + (f"{rounds} | " if spread else "") +
                     f"{t['op']} {t['threshold']} | {STATE[t['met']]} | {t.get('why', '')} |")
    return lines


def table_markdown(result):
    """One table result as Markdown: the rows, the targets, the extras."""
    columns = list(result.get("columns") or ["name", "median", "min", "max", "ratio"])
    if "ratio" in columns and any(r.get("ratio_rounds") for r in result.get("rows", [])):
        columns.insert(columns.index("ratio") + 1, "ratio_rounds")
    lines = rows_markdown(result.get("rows", []), columns, result.get("unit", ""))
    if result.get("knobs"):
        lines += ["", "Knobs (examples/s; ratio to the first row of each group):", ""]
        lines += rows_markdown(result["knobs"], ["name", "median", "min", "max", "ratio",
                                                 "batch_size"], "examples/s")
    if result.get("memory"):
        lines += ["", "Resident memory per epoch, fresh process each (MB):", ""]
        lines += ["| pipeline | RSS before, then after each epoch | growth 2->last | "
                  "epoch 1 - before | cache estimate |", "| --- | --- | --- | --- | --- |"]
        for m in result["memory"]:
            rss = ", ".join(f"{v:.0f}" for v in m.get("rss_mb") or [])
            lines.append(f"| {m['name']} | {rss or m.get('error', '')} | "
                         f"{fmt_value(m.get('growth'))} | {fmt(m.get('cache_mb'))} | "
                         f"{fmt(m.get('cache_estimate_mb'))} |")
    if result.get("stalled"):
        lines += ["", "**Stalled** (a turn over twice its run's median; the round's figures "
                      "carry it):", ""] + [f"- {stall}" for stall in result["stalled"]]
    if result.get("targets"):
        lines += [""] + targets_markdown(result["targets"])
    return "\n".join(lines)


def glance_markdown(results):
    """Every target of every table in one table."""
    lines = []
    spread = any(t.get("rounds") for result in results["tables"].values()
                 for t in result.get("targets", []))
    for name, result in results["tables"].items():
        part = targets_markdown(result.get("targets", []), table=name, spread=spread)
        lines += part if not lines else part[2:]
    return "\n".join(lines)


def main(argv=None):
    argv = argv if argv is not None else sys.argv[1:]
    if len(argv) != 1:
        sys.stderr.write("usage: python -m benchmarks.report RESULTS.json\n")
        return 2
    with open(argv[0]) as f:
        results = json.load(f)
    print("### Targets at a glance\n")
    print(glance_markdown(results))
    print()
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
