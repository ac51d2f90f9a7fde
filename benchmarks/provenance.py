"""Which code each benchmark table's numbers come from, and whether it has
changed since they were measured.

BENCHMARKS.md may join tables from several runs, each run on its own
commit, as long as no table's code changed after its run. A table's code
(:func:`code_paths`) is the library (``estimator_keras/``), the built-in
experiments it trains (``experiments/``), the package's metadata
(``setup.py``), and the benchmark modules that run it: its own module and
what it and ``benchmarks/cli.py`` import from ``benchmarks`` (read from
their source). BENCHMARKS.md lists every table with the commit it ran on in
its "Where each table comes from" section (:func:`read_runs`); a table whose
code has changed since must say so there (``stale: why``), and
``tests/test_benchmarks.py`` checks both directions from git. A table that
has never run is listed with ``-`` for its commit and file and the state
:data:`NOT_RUN`.

Example::

    python -m benchmarks.provenance     # each table: its commit, current or stale
"""

import ast
import os
import re
import subprocess
import sys

from benchmarks import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What every table runs through, whichever benchmark module measures it.
SHARED_CODE = ("estimator_keras", "experiments", "setup.py")
SECTION = "## Where each table comes from"
NOT_RUN = "not run yet"
_ROW = re.compile(r"^\|\s*`(?P<table>[a-z0-9_]+)`\s*\|\s*(?P<commit>`[0-9a-f]{7,40}`|-)\s*\|"
                  r"(?P<when>[^|]*)\|(?P<file>[^|]*)\|(?P<state>[^|]*)\|\s*$")


def _benchmark_imports(module_path):
    """The modules of the ``benchmarks`` package that ``module_path``
    imports, as paths relative to the checkout."""
    with open(os.path.join(ROOT, module_path), encoding="utf-8") as f:
        tree = ast.parse(f.read(), module_path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "benchmarks":
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks."):
            names.add(node.module.split(".", 1)[1])
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".", 1)[1] for a in node.names
                         if a.name.startswith("benchmarks."))
    return {f"benchmarks/{n.split('.')[0]}.py" for n in names
            if os.path.isfile(os.path.join(ROOT, "benchmarks", n.split(".")[0] + ".py"))}


def code_paths(table):
    """The paths (relative to the checkout) whose change changes what
    ``table`` measures."""
    module = cli.TABLES[table][0].replace(".", "/") + ".py"
    seen, todo = set(), [module, "benchmarks/cli.py", "benchmarks/__main__.py"]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo.extend(_benchmark_imports(path) - seen)
    return sorted(SHARED_CODE) + sorted(seen)


def read_runs(text):
    """{table: {"commit", "when", "file", "state"}} from BENCHMARKS.md's
    section :data:`SECTION`; ValueError when it is missing or a table is
    listed twice."""
    if SECTION not in text:
        raise ValueError(f"BENCHMARKS.md has no {SECTION!r} section")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    runs = {}
    for line in section.splitlines():
        match = _ROW.match(line.strip())
        if not match:
            continue
        row = {k: v.strip().strip("`") for k, v in match.groupdict().items()}
        table = row.pop("table")
        if table in runs:
            raise ValueError(f"BENCHMARKS.md lists table {table!r} twice in {SECTION!r}")
        runs[table] = row
    return runs


def changed_since(commit, paths, root=ROOT):
    """The files among ``paths`` that differ between ``commit`` and the
    checkout's HEAD (git's own answer; raises RuntimeError where git does
    not know the commit, as in a shallow clone)."""
    known = subprocess.run(["git", "-C", root, "cat-file", "-e", f"{commit}^{{commit}}"],
                           capture_output=True, text=True, timeout=60, check=False)
    if known.returncode:
        raise RuntimeError(f"git does not know commit {commit} in {root} (a shallow clone? "
                           f"fetch the full history): {known.stderr.strip()}")
    diff = subprocess.run(["git", "-C", root, "diff", "--name-only", commit, "HEAD", "--",
                           *paths], capture_output=True, text=True, timeout=60, check=True)
    return diff.stdout.split()


def main():
    with open(os.path.join(ROOT, "BENCHMARKS.md"), encoding="utf-8") as f:
        runs = read_runs(f.read())
    for table in cli.TABLES:
        run = runs.get(table)
        if run is None:
            print(f"{table}: not listed in BENCHMARKS.md")
            continue
        if run["state"] == NOT_RUN:
            print(f"{table}: {NOT_RUN}")
            continue
        changed = changed_since(run["commit"], code_paths(table))
        state = (f"stale, {len(changed)} file(s) changed since, e.g. {changed[0]}" if changed
                 else "current")
        print(f"{table}: commit {run['commit']}, {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
