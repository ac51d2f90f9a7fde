"""Rounds of a table: the same table run several times, each in a fresh
process, merged into one result.

A ratio measured side by side in one process can still rest on that
process's luck: the keras table's plain tf-keras baseline ran at 459.5 and
at 305.0 steps/s in two runs of unchanged code. So the full run repeats the
ratio tables (:data:`benchmarks.cli.ROUND_TABLES`) and a target counts as met
only when every round meets it (:func:`benchmarks.common.target` with
``rounds``); the merged result shows each target's spread over the rounds.
"""

from benchmarks import common

# Row fields that are one number per round, merged as the median of the rounds
# (each round's kept in FIELD_rounds): ratios, and the recipe table's whole runs
# and their pairs.
RATIO_FIELDS = ("ratio", "ratio_of_medians", "ratio_best", "wall_s", "t091_s",
                "steps_per_wall_s", "wall_ratio", "t091_ratio")


def merge(results):
    """One table result out of the results of its rounds (dicts as the
    tables return them; a failed round is ``{"error": ...}``)."""
    done = [r for r in results if "error" not in r]
    if not done:
        return dict(results[0], rounds=len(results))
    merged = dict(done[0])
    merged["rounds"] = len(results)
    errors = [f"round {k}: {r['error']}" for k, r in enumerate(results, 1) if "error" in r]
    if errors:
        merged["round_errors"] = errors
    merged["seconds"] = round(sum(r.get("seconds") or 0 for r in results), 1)
    merged["load_before"] = done[0].get("load_before")
    merged["load_after"] = done[-1].get("load_after")
    merged["rows"] = [_merge_row(row, [_find(r.get("rows", []), "name", row["name"])
                                       for r in results])
                      for row in done[0].get("rows", [])]
    if done[0].get("pairs"):
        merged["pairs"] = [_merge_row(pair, [_find(r.get("pairs", []), "name", pair["name"])
                                             for r in results])
                           for pair in done[0]["pairs"]]
    merged["targets"] = [_merge_target(t, [_find(r.get("targets", []), "id", t["id"])
                                           for r in results])
                         for t in done[0].get("targets", [])]
    stalled = [f"round {k}: {line}" for k, r in enumerate(results, 1)
               for line in r.get("stalled") or []]
    merged["stalled"] = stalled
    merged["stalled_rounds"] = sorted({k for k, r in enumerate(results, 1)
                                       if r.get("stalled")})
    if done[0].get("memory"):
        merged["memory_rounds"] = [r.get("memory") for r in done]
    merged["notes"] = list(done[0].get("notes", [])) + [
        f"{len(results)} rounds, each a fresh process: rows pool every round's windows "
        f"(median, min, max) and give the median of the rounds' ratios (ratio_rounds: each "
        f"round's); a target is met only when every round meets it (spread: min / median / "
        f"max over the rounds)"]
    return merged


def _find(items, key, value):
    return next((item for item in items if item.get(key) == value), None)


def _merge_row(first, rows):
    row = dict(first)
    present = [r for r in rows if r is not None]
    samples = [x for r in present for x in r.get("samples") or []]
    if samples:
        row.update(samples=samples, median=common.median(samples), min=min(samples),
                   max=max(samples))
    for field in RATIO_FIELDS:
        values = [r.get(field) if r is not None else None for r in rows]
        if any(v is not None for v in values):
            row[f"{field}_rounds"] = values
            measured = [v for v in values if v is not None]
            row[field] = common.median(measured)
    errors = [r["error"] for r in present if r.get("error")]
    if errors:
        row["error"] = errors[0]
    return row


def _merge_target(first, targets):
    values = [t.get("value") if t is not None else None for t in targets]
    causes = [t.get("cause") for t in targets if t is not None and t.get("cause")]
    return common.target(first["id"], first["description"], None, first["threshold"],
                         first["op"], why=causes[0] if causes else None, rounds=values)
