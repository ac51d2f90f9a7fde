"""What the benchmark tables print and write: the machine they ran on,
rows and targets as text, and results as JSON written atomically."""

import datetime
import json
import os
import platform
import statistics

from estimator_keras import io


def format_spread(spread, threshold=None, op=None):
    """"min / median / max" of a target's rounds, or "-"; each figure quoted
    as :func:`fmt_value` quotes it against the target's threshold."""
    return " / ".join(fmt_value(v, threshold, op) for v in spread) if spread else "-"


def fmt_value(value, threshold=None, op=None):
    """A target's value: 3 significant digits below 100, thousands separators
    above; against a ``threshold``, as many more digits as it takes for the
    quoted figure to stand on the same side of it as the value itself (0.97988
    against >= 0.98 is quoted 0.9799, never 0.98)."""
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    for digits in range(3, 10):
        quoted = f"{value:.{digits}g}"
        if threshold is None or _side(float(quoted), threshold, op) == \
                _side(value, threshold, op):
            return quoted
    return repr(value)


def _side(value, threshold, op):
    """Whether ``value op threshold`` holds, and whether it is the threshold."""
    holds = {">=": value >= threshold, "<": value < threshold, "<=": value <= threshold,
             None: value >= threshold}[op]
    return holds, value == threshold


def fmt_ratio(value):
    """A ratio cell: 4 significant digits and an x (0.9799x, 1.015x, 1.000x)."""
    return "-" if value is None else f"{value:#.4g}x"


def stalled_turns(durations, factor=2.0):
    """The indices of ``durations`` (seconds of one run's turns, or of one
    way's runs) over ``factor`` times their median: a turn the machine
    stalled, which the round's figures then carry. Needs three or more."""
    values = [d for d in durations if d is not None]
    if len(values) < 3:
        return []
    middle = statistics.median(values)
    return [k for k, d in enumerate(durations) if d is not None and d > factor * middle]


def machine_info():
    """Where the numbers come from: cores, CPU, memory, versions, load."""
    info = {"nproc": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform()}
    try:
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            models = [line.split(":", 1)[1].strip() for line in f
                      if line.startswith("model name")]
        info["cpu_model"] = models[0] if models else None
    except OSError:
        info["cpu_model"] = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    info["mem_total_gib"] = round(int(line.split()[1]) / 2 ** 20, 1)
    except OSError:
        pass
    try:
        import numpy as np  # pylint: disable=import-outside-toplevel
        info["numpy"] = np.__version__
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        info["tensorflow"] = tf.__version__
    except ImportError:
        pass
    try:
        from importlib import metadata  # pylint: disable=import-outside-toplevel
        info["tensorflow_estimator"] = metadata.version("tensorflow-estimator")
    except Exception:  # pylint: disable=broad-except
        info["tensorflow_estimator"] = None
    info["loadavg"] = load_average()
    return info


def proc_status_mb(field):
    """A memory figure of this process in MB from /proc/self/status
    ("VmRSS": resident now, "VmHWM": its peak), or None off Linux."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def rss_mb():
    """This process's resident memory in MB (VmRSS), or None off Linux."""
    return proc_status_mb("VmRSS")


def load_average():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def write_json(obj, path):
    """Writes ``obj`` to ``path`` atomically (see :func:`estimator_keras.io.atomic_file`)."""
    io.makedirs(io.parent(os.path.abspath(path)))
    with io.atomic_file(path) as f:
        json.dump(obj, f, indent=2, default=_jsonable)


def _jsonable(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def fmt(value, digits=None):
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if digits is not None:
        return f"{value:,.{digits}f}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:,.1f}"
    return f"{value:,.2f}"


def format_table(result):
    """A table result (dict) as text: rows with medians and ratios, then targets."""
    lines = [f"== {result['table']}: {result.get('title', '')}"]
    unit = result.get("unit", "")
    rows = result.get("rows", [])
    if rows:
        columns = result.get("columns") or ["name", "median", "min", "max", "ratio"]
        header = [c if c != "median" else f"median {unit}".strip() for c in columns]
        table = [header]
        for row in rows:
            cells = []
            for c in columns:
                v = row.get(c)
                if c in ("ratio", "ratio_best") and v is not None:
                    cells.append(fmt_ratio(v))
                elif isinstance(v, float):
                    cells.append(fmt(v, 4) if abs(v) < 1 else fmt(v))
                elif v is None:
                    cells.append("-")
                else:
                    cells.append(str(v))
            if row.get("error"):
                cells[-1] = f"{cells[-1]} ERROR: {row['error'][:80]}"
            if row.get("not_measured"):
                cells[-1] = f"{cells[-1]} not measured: {row['not_measured'][:80]}"
            table.append(cells)
        widths = [max(len(r[i]) for r in table) for i in range(len(header))]
        for k, r in enumerate(table):
            lines.append("  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i])
                                   for i, cell in enumerate(r)).rstrip())
            if k == 0:
                lines.append("  ".join("-" * w for w in widths))
    for t in result.get("targets", []):
        state = {True: "MET", False: "NOT MET", None: "n/a"}[t["met"]]
        value = fmt_value(t["value"], t["threshold"], t["op"])
        rounds = (f" [{len(t['rounds'])} rounds, min / median / max "
                  f"{format_spread(t.get('spread'), t['threshold'], t['op'])}]"
                  if t.get("rounds") else "")
        lines.append(f"  target {t['id']}: {t['description']}: {value}{rounds} "
                     f"(need {t['op']} {t['threshold']}) {state}"
                     + (f": {t['why']}" if t.get("why") else ""))
    for stall in result.get("stalled", []):
        lines.append(f"  STALLED: {stall}")
    for note in result.get("notes", []):
        lines.append(f"  note: {note}")
    return "\n".join(lines)
