"""The pages of README.md and docs/ as the tests read them: their blocks,
the markers before them, and the outputs they show compared with real ones.

A ```text block shows an output, and the line before it says what it is
checked against:

- ``<!-- checked: output of the block above -->``: what the last block the
  page's run executed printed (tests/test_docs.py runs the page);
- ``<!-- checked: transcript -->``: each ``$ COMMAND`` line is run in the
  page's run and followed by what it prints;
- ``<!-- checked by: tests/test_x.py::test_y -->``: that test compares its
  own run's output with the block (:func:`assert_shows`).

Options follow, separated by ``;``: ``on ENGINE`` (the block is what
``--engine auto`` prints where it picks ENGINE: compared only there, each
other engine's page run or test skipping it) and ``numbers vary`` (each
number, and each duration such as ``1 min 2 s``, matches any other; a table's
columns may then be padded to other widths). In any
block a line ``...`` stands for any number of lines; every other line, its
words, file names and place in the order, must be in the real output.
"""

import collections
import glob
import os
import re

from support import ROOT, child_env

README_PATH = os.path.join(ROOT, "README.md")
DOC_PATHS = [README_PATH] + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                             recursive=True))

FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<lang>[\w-]*)(?P<attrs>.*)$")
COMMENT = re.compile(r"^ *<!-- (?P<kind>[\w ]+):\s*(?P<text>.*?)\s*-->$")
TITLE = re.compile(r'title="([^"]*)"')
ELIDED = "..."
COLUMN_GAP = re.compile(r" {2,}")
# The engines whose `--engine auto` pages and tests compare: estimator on
# TensorFlow 2.15 (py311), keras3 on Python 3.12+ with '.[cpu]' (py313).
DOCUMENTED_ENGINES = ("estimator", "keras3")

Block = collections.namedtuple("Block", "path line lang title marker body")
Setup = collections.namedtuple("Setup", "path line command")
Check = collections.namedtuple("Check", "how target engine numbers_vary")


def rel(path):
    return os.path.relpath(path, ROOT)


def page_steps(path):
    """The blocks and `<!-- setup: ... -->` lines of one Markdown file, in order."""
    lines = open(path, encoding="utf-8").read().split("\n")
    steps, i = [], 0
    while i < len(lines):
        comment = COMMENT.match(lines[i])
        if comment and comment.group("kind") == "setup":
            steps.append(Setup(rel(path), i + 1, comment.group("text")))
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening.group("indent"), opening.group("fence")
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        body = "\n".join(line[len(indent):] if line.startswith(indent) else line.lstrip()
                         for line in lines[i + 1:j]) + "\n"
        before = [line for line in lines[:i] if line.strip()]
        marker = COMMENT.match(before[-1]) if before else None
        title = TITLE.search(opening.group("attrs"))
        steps.append(Block(rel(path), i + 1, opening.group("lang"),
                           title.group(1) if title else None,
                           (marker.group("kind"), marker.group("text"))
                           if marker and marker.group("kind") != "setup" else None, body))
        i = j + 1
    return steps


STEPS = {rel(p): page_steps(p) for p in DOC_PATHS}
BLOCKS = [s for steps in STEPS.values() for s in steps if isinstance(s, Block)]


def where(block):
    return f"{block.path}:{block.line}"


def check_of(block):
    """The block's :class:`Check`, None when it has no ``checked`` marker;
    ValueError naming what is wrong with one."""
    kind, text = block.marker or (None, None)
    if kind not in ("checked", "checked by"):
        return None
    what, *options = [part.strip() for part in text.split(";")]
    engine, numbers_vary = None, False
    for option in options:
        if option == "numbers vary":
            numbers_vary = True
        elif option.startswith("on ") and option[3:] in DOCUMENTED_ENGINES:
            engine = option[3:]
        else:
            raise ValueError(f"unknown option {option!r}: `on ENGINE` (one of "
                             f"{', '.join(DOCUMENTED_ENGINES)}) or `numbers vary`")
    if kind == "checked":
        if what not in ("output of the block above", "transcript"):
            raise ValueError(f"unknown check {what!r}: `output of the block above` or "
                             f"`transcript`")
        return Check(what, None, engine, numbers_vary)
    if not re.fullmatch(r"tests/test_\w+\.py::test_\w+", what):
        raise ValueError(f"`checked by:` names {what!r}, not tests/test_x.py::test_y")
    return Check("checked by", what, engine, numbers_vary)


def docs_engine():
    """The engine ``--engine auto`` picks in the tests' child processes."""
    from estimator_keras import engines  # pylint: disable=import-outside-toplevel
    return engines.auto_from_metadata(child_env())


def compared_here(check, engine):
    return check.engine in (None, engine)


# A duration as the CLI writes one ("45 s", "1 min 2 s", "2.5 s"), then any number.
DURATION = re.compile(r"\b(?:\d+ h )?(?:\d+ min )?\d+(?:\.\d+)? s\b")
NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?(?:e-?\d+)?")


def _lines(text, numbers_vary):
    lines = [line.rstrip() for line in text.strip("\n").split("\n")]
    if numbers_vary:
        # A table pads its columns to its widest number, so the padding varies
        # with the numbers: any run of two or more spaces matches any other.
        lines = [line if line == ELIDED else
                 COLUMN_GAP.sub("  ", NUMBER.sub("N", DURATION.sub("T", line)))
                 for line in lines]
    return lines


def mismatch(shown, actual, numbers_vary=False):
    """None when ``actual`` is what ``shown`` shows (see the module's
    docstring), else where they part, in words."""
    want, got = _lines(shown, numbers_vary), _lines(actual, numbers_vary)
    runs = [[]]
    for line in want:
        if line == ELIDED:
            runs.append([])
        else:
            runs[-1].append(line)
    pos, last = 0, len(runs) - 1
    for k, run in enumerate(runs):
        if not run:
            continue
        if k == last:  # anchored at the end (and, without any `...`, at the start too)
            places = [len(got) - len(run)] if k > 0 else [0]
        else:
            places = [0] if k == 0 else range(pos, len(got) - len(run) + 1)
        found = next((i for i in places if i >= pos and got[i:i + len(run)] == run), None)
        if found is None:
            return _parting(run, got, places[0] if k in (0, last) and places else pos)
        pos = found + len(run)
    if last == 0 and pos != len(got):
        return f"the real output goes on after the shown lines: {got[pos]!r}"
    return None


def _parting(run, got, at):
    for offset, line in enumerate(run):
        i = at + offset
        if i < 0 or i >= len(got):
            return f"the shown line {line!r} is past the end of the real output"
        if got[i] != line:
            return f"the shown line {line!r} is {got[i]!r} in the real output"
    return f"the shown lines {run[0]!r}... are not in the real output in this order"


def assert_shows(request, output):
    """Compares ``output``, the real output of the calling test, with each
    block marked ``<!-- checked by: FILE::TEST -->`` for this test and this
    engine. ``request`` is the test's pytest request."""
    target = f"{rel(str(request.path))}::{request.node.originalname}"
    engine = docs_engine()
    shown = [b for b in BLOCKS if (check_of(b) or Check(None, None, None, False)).target
             == target]
    assert shown, f"no page has a block marked `checked by: {target}`"
    here = [b for b in shown if compared_here(check_of(b), engine)]
    assert here, (f"the pages show the output of {target} for "
                  f"{sorted({check_of(b).engine for b in shown})}, not for the engine "
                  f"{engine} this environment runs")
    for block in here:
        problem = mismatch(block.body, output, check_of(block).numbers_vary)
        assert problem is None, (f"{where(block)} is not what {target} printed: {problem}\n"
                                 f"real output:\n{output}")


def readme_block(title):
    """The body of the fenced block that opens with the line
    ```python title="TITLE" in README.md or a page of docs/ (the first found)."""
    opening = f'```python title="{title}"\n'
    paths = [README_PATH] + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                             recursive=True))
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        start = text.find(opening)
        if start >= 0:
            start += len(opening)
            end = text.find("\n```", start)
            assert end > start, f"{path}: the block {title} is not closed"
            return text[start:end + 1]
    raise AssertionError(f'no block opening with ```python title="{title}" in README.md '
                         f"or docs/ (docs/tutorials/ has the example module and predict.py)")
