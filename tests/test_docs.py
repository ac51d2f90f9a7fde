"""README.md and docs/ say what the code and the tests do.

- The README stays a short front page; CI runs its test command as written.
- Every ```bash and ```python block of README.md and docs/**/*.md is run here
  (a page's blocks in order, in a fresh project folder), or the line before it
  says what runs it (`<!-- run by: tests/test_x.py::test_y -->`, checked: the
  test exists and uses the block's commands and flags) or why it cannot run
  here (`<!-- not run: REASON -->`).
- Outputs (```text blocks) are compared with a real run
  (`<!-- checked: output of the block above -->`, `<!-- checked: transcript -->`)
  or carry the version that made them in their title.
- The case counts of "What survives what" are the tests' own constants.
- `mkdocs build --strict` passes: no broken link, no missing page, no
  unresolved API reference.
"""

import ast
import collections
import glob
import importlib
import os
import re
import shlex
import subprocess
import sys

import pytest

import estimator_keras
from support import FASHION, ROOT, child_env

README_PATH = os.path.join(ROOT, "README.md")
README = open(README_PATH, encoding="utf-8").read()
CI = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
DOC_PATHS = [README_PATH] + sorted(glob.glob(os.path.join(ROOT, "docs", "**", "*.md"),
                                             recursive=True))
MAX_README_LINES = 250

RUNNABLE = {"bash", "sh", "shell", "console", "python", "py", "pycon"}
EXECUTED = {"bash", "python"}  # what an unmarked block may be
VERSIONED = re.compile(r"estimator[-_ ]keras[- ](\d+\.\d+\.\d+)")
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<lang>[\w-]*)(?P<attrs>.*)$")
COMMENT = re.compile(r"^ *<!-- (?P<kind>[\w ]+):\s*(?P<text>.*?)\s*-->$")
TITLE = re.compile(r'title="([^"]*)"')
FILE_TITLE = re.compile(r"^[\w][\w.-]*(/[\w][\w.-]*)*\.\w+$")

Block = collections.namedtuple("Block", "path line lang title marker body")
Setup = collections.namedtuple("Setup", "path line command")


def _rel(path):
    return os.path.relpath(path, ROOT)


def _page_steps(path):
    """The blocks and `<!-- setup: ... -->` lines of one Markdown file, in order."""
    lines = open(path, encoding="utf-8").read().split("\n")
    steps, i = [], 0
    while i < len(lines):
        comment = COMMENT.match(lines[i])
        if comment and comment.group("kind") == "setup":
            steps.append(Setup(_rel(path), i + 1, comment.group("text")))
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
        steps.append(Block(_rel(path), i + 1, opening.group("lang"),
                           title.group(1) if title else None,
                           (marker.group("kind"), marker.group("text"))
                           if marker and marker.group("kind") != "setup" else None, body))
        i = j + 1
    return steps


STEPS = {_rel(p): _page_steps(p) for p in DOC_PATHS}
BLOCKS = [s for steps in STEPS.values() for s in steps if isinstance(s, Block)]


def _where(block):
    return f"{block.path}:{block.line}"


# ---------------------------------------------------------------------------
# The README: short, and the quickstart CI runs


def _section(title):
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def _quickstart_commands():
    """The quickstart's first bash block (the main command) and its test command."""
    blocks = re.findall(r"```bash\n(.*?)```", _section("Quickstart"), re.S)
    main, tests = ([line for line in block.splitlines()
                    if line.strip() and not line.startswith("#")] for block in blocks[:2])
    assert len(main) == 1 and len(tests) == 1, (main, tests)
    return main[0], tests[0]


def test_the_readme_is_a_short_front_page():
    lines = README.count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines (at most {MAX_README_LINES})"
    for section in ("Quickstart", "Your own images in three commands",
                    "Your own model in one module", "Commands", "Documentation"):
        assert f"\n## {section}\n" in README, section
    assert 'tox -- -m "not slow"' in _section("Quickstart")


def test_the_quickstart_makes_a_venv_and_uses_it():
    main, tests = _quickstart_commands()
    steps = [shlex.split(step) for step in main.split("&&")]
    assert ["python3", "-m", "venv", ".venv"] in steps
    assert steps[-1] == [".venv/bin/python", "-m", "experiments", "train", "fashion_mnist_cnn"]
    assert [".venv/bin/pip", "install", "-e", ".[cpu]"] in steps
    assert tests.startswith(".venv/bin/")


def test_ci_runs_exactly_the_readme_test_command():
    _, tests = _quickstart_commands()
    ci_lines = [line.strip() for line in CI.splitlines()]
    assert tests in ci_lines, (tests, CI)
    assert "python3 -m venv .venv" in CI


def test_readme_links_into_the_docs_resolve():
    for target in re.findall(r"\]\(((?:docs/|BENCHMARKS)[^)#]*)", README):
        assert os.path.exists(os.path.join(ROOT, target)), target


# ---------------------------------------------------------------------------
# Versions, placeholders, "What survives what"


def test_sample_outputs_name_this_version():
    found = {}
    for path in DOC_PATHS:
        for version in VERSIONED.findall(open(path, encoding="utf-8").read()):
            found.setdefault(version, set()).add(_rel(path))
    assert found, "no versioned sample output in README.md or docs/"
    assert set(found) == {estimator_keras.__version__}, found


def test_no_placeholder_is_left():
    for path in DOC_PATHS:
        text = open(path, encoding="utf-8").read()
        assert "@@TODO" not in text and not re.search(r"@@[\w.]+@@", text), path


def _survival_rows():
    page = open(os.path.join(ROOT, "docs", "explanation", "what-survives-what.md"),
                encoding="utf-8").read()
    for line in page.splitlines():
        if not line.startswith("| ") or line.startswith("| ---") or "cases tried" in line:
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        yield cells[1], cells[2]


def test_what_survives_what_has_its_rows():
    assert len(list(_survival_rows())) >= 10


@pytest.mark.parametrize("test, cases", list(_survival_rows()))
def test_what_survives_what_counts_come_from_the_tests(test, cases):
    files = re.findall(r"tests/(\w+)\.py", test)
    assert files, f"no test named in: {test}"
    for name, value in re.findall(r"`(\w+)` = (\([^)]*\)|[\d,]+)", cases):
        module = importlib.import_module(files[0])
        assert getattr(module, name) == ast.literal_eval(value.replace(",", "")
                                                         if value[0] != "(" else value), \
            f"{files[0]}.{name} is {getattr(module, name)!r}, the docs say {value}"


# ---------------------------------------------------------------------------
# Every example is run or marked


def _check_marker(block):
    """What is wrong with a block's marker, or None."""
    kind, text = block.marker or (None, None)
    if block.lang in RUNNABLE:
        if kind is None:
            return None if block.lang in EXECUTED else \
                f"a ```{block.lang} block is not run here: use ```bash or ```python, or mark it"
        if kind == "not run":
            return None if len(text) > 10 else "`not run:` needs a reason"
        if kind == "run by":
            return None if _run_by_targets(text) else "`run by:` names no target"
        return f"unknown marker {kind!r} (not run, run by, or none)"
    if block.lang == "text":
        if kind == "checked":
            return None if text in ("output of the block above", "transcript") else \
                f"unknown check {text!r}"
        if block.title and VERSIONED.search(block.title):
            return None
        return ("an output (```text) is neither checked nor titled with the version that "
                'made it (title="estimator-keras X.Y.Z, ...")')
    return f"marker {kind!r} on a ```{block.lang} block" if kind in ("run by", "checked") \
        else None


def test_every_example_is_run_or_marked():
    wrong = [f"{_where(b)}: {problem}" for b in BLOCKS if (problem := _check_marker(b))]
    assert not wrong, "\n".join(wrong)
    assert any(b.lang in EXECUTED and b.marker is None for b in BLOCKS)


def _run_by_targets(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def _function_strings(name, functions, constants, seen):
    """String constants of the module-level function ``name`` and of what it
    draws on: the fixtures it takes, the module's functions it calls and the
    module-level constants it names (``functions``: name -> FunctionDef,
    ``constants``: name -> the strings of its assignment)."""
    if name in seen:
        return set()
    seen.add(name)
    if name in constants:
        return constants[name]
    node = functions.get(name)
    if node is None:
        return set()
    found = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
             and isinstance(n.value, str)}
    used = [arg.arg for arg in node.args.args]
    used += [n.id for n in ast.walk(node) if isinstance(n, ast.Name)]
    for other in used:
        found |= _function_strings(other, functions, constants, seen)
    return found


def _constants(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            strings = {n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant)
                       and isinstance(n.value, str)}
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = strings
    return out


def _functions(*paths):
    out = {}
    for path in paths:
        tree = ast.parse(open(path, encoding="utf-8").read())
        out.update({n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)})
    return out


def _commands(body):
    """The arguments after ``python -m experiments`` of each command in a bash block."""
    logical = body.replace("\\\n", " ")
    for line in logical.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for k in range(len(words) - 2):
            if words[k].endswith("python") and words[k + 1:k + 3] == ["-m", "experiments"]:
                rest = words[k + 3:]
                end = next((i for i, w in enumerate(rest) if w in ("&&", "||", ";", "|")),
                           len(rest))
                yield rest[:end]


def _tokens(args):
    """The words of a command that a test running it must spell: flags, the
    command, and the experiment or dataset name right after it."""
    rest = list(args)
    while rest and rest[0] in ("--module", "--verbose"):
        rest = rest[2:] if rest[0] == "--module" else rest[1:]
    words = set(rest[:1])
    if len(rest) > 1 and re.fullmatch(r"[a-z][a-z0-9_]*", rest[1]):
        words.add(rest[1])
    return words | {a.split("=")[0] for a in args if a.startswith("--")}


RUN_BY = [b for b in BLOCKS if b.marker and b.marker[0] == "run by"]


@pytest.mark.parametrize("block", RUN_BY, ids=_where)
def test_run_by_names_tests_that_run_the_same_commands(block):
    strings, sources = set(), ""
    for target in _run_by_targets(block.marker[1]):
        if target == ".ci/run":
            ci_lines = {line.strip() for line in CI.splitlines()}
            for line in block.body.splitlines():
                if line.strip() and not line.startswith("#"):
                    assert line.strip() in ci_lines, f"{_where(block)}: .ci/run lacks {line!r}"
            continue
        path, _, name = target.partition("::")
        full = os.path.join(ROOT, path)
        assert re.fullmatch(r"tests/test_\w+\.py", path) and os.path.isfile(full), \
            f"{_where(block)}: no test file {path}"
        source = open(full, encoding="utf-8").read()
        sources += source
        functions = _functions(full, os.path.join(ROOT, "tests", "conftest.py"))
        if name:
            assert name in functions and name.startswith("test_"), \
                f"{_where(block)}: {path} has no test {name}"
            strings |= _function_strings(name, functions, _constants(full), set())
        else:
            strings |= {n.value for n in ast.walk(ast.parse(source))
                        if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    if block.title in strings:
        return  # the tests read this very block, by its title
    # A docs file the tests read by its title (an example module) brings its names.
    for other in BLOCKS:
        if other.title and other.title in strings:
            strings |= set(re.findall(r"\w+", other.body))
    if block.lang == "bash":
        for args in _commands(block.body):
            missing = sorted(_tokens(args) - strings)
            assert not missing, (f"{_where(block)}: the named tests do not run "
                                 f"`{' '.join(args)}`: no {missing}")
    elif block.lang == "python":
        for node in ast.walk(ast.parse(block.body)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
                    "estimator_keras", "experiments"):
                for alias in node.names:
                    assert alias.name in sources, \
                        f"{_where(block)}: the named tests never use {alias.name}"


# ---------------------------------------------------------------------------
# Running the pages' examples


def _normalize(text, project):
    text = text.replace(sys.executable, "python").replace(str(project / "bin" / "python"),
                                                           "python")
    text = re.sub(r"\d{8}-\d{6}", "YYYYMMDD-HHMMSS", text)
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


def _project(tmp_path):
    """A fresh folder where `python` is this interpreter running the checkout,
    holding every file a docs block is titled with."""
    project = tmp_path / "project"
    (project / "bin").mkdir(parents=True)
    # A script, not a link: a link to a virtual environment's python outside
    # its bin/ folder would not find the environment.
    shim = project / "bin" / "python"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n', encoding="utf-8")
    shim.chmod(0o755)
    for block in BLOCKS:
        if block.title and FILE_TITLE.match(block.title) and ".." not in block.title:
            target = project / block.title
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.body, encoding="utf-8")
    env = child_env()
    env.pop("ESTIMATOR_KERAS_DATA_DIR", None)
    env["PATH"] = f"{project / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    return project, env


def _run(args, project, env, what):
    proc = subprocess.run(args, cwd=str(project), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    return proc.returncode, proc.stdout


def _is_checked(step):
    return isinstance(step, Block) and bool(step.marker) and step.marker[0] == "checked"


def _pages_to_run(steps_by_page):
    """The pages with something to run or compare: a setup line, an unmarked
    bash/python block, or a checked output (a transcript runs its own commands)."""
    return [page for page, steps in steps_by_page.items()
            if any(isinstance(s, Setup) or _is_checked(s)
                   or (s.lang in EXECUTED and s.marker is None) for s in steps)]


RUN_PAGES = _pages_to_run(STEPS)


def test_every_checked_output_is_on_a_page_that_runs():
    checked = [b for b in BLOCKS if _is_checked(b)]
    assert checked, "no checked output in README.md or docs/"
    assert not [_where(b) for b in checked if b.path not in RUN_PAGES]


def test_a_page_whose_only_example_is_a_transcript_is_run(tmp_path):
    page = tmp_path / "transcript-only.md"
    page.write_text("# A page\n\n<!-- checked: transcript -->\n```text\n$ echo hi\nhi\n```\n",
                    encoding="utf-8")
    steps = _page_steps(str(page))
    assert _pages_to_run({"transcript-only.md": steps}) == ["transcript-only.md"]


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_pages_examples_run(page, tmp_path):
    if not os.path.isdir(FASHION):
        pytest.skip("dataset-fashion-mnist is not installed (CI installs it)")
    project, env = _project(tmp_path)
    last, compared = None, []
    for k, step in enumerate(STEPS[page]):
        where = f"{step.path}:{step.line}"
        if isinstance(step, Setup):
            rc, out = _run(["bash", "-c", step.command], project, env, where)
            assert rc == 0, f"{where}: setup failed (exit {rc}):\n{out[-3000:]}"
            continue
        if step.lang in EXECUTED and step.marker is None:
            if step.lang == "bash":
                args = ["bash", "-e", "-o", "pipefail", "-c", step.body]
            else:
                script = step.title if step.title and FILE_TITLE.match(step.title) \
                    else f"_block_{k}.py"
                (project / script).write_text(step.body, encoding="utf-8")
                args = ["python", str(project / script)]
            rc, last = _run(args, project, env, where)
            assert rc == 0, f"{where}: exit {rc}:\n{last[-3000:]}"
        elif step.marker == ("checked", "output of the block above"):
            assert last is not None, f"{where}: no block ran before this output"
            assert _normalize(last, project) == _normalize(step.body, project), \
                f"{where}: the output shown is not what the block above prints now:\n{last}"
            compared.append(step)
        elif step.marker == ("checked", "transcript"):
            shown = re.split(r"^\$ (.*)\n", step.body, flags=re.M)
            assert len(shown) > 1, f"{where}: a transcript without a `$ command` line"
            for command, expected in zip(shown[1::2], shown[2::2]):
                _, out = _run(["bash", "-c", command], project, env, where)
                assert _normalize(out, project) == _normalize(expected, project), \
                    f"{where}: `{command}` now prints:\n{out}"
            compared.append(step)
    # Every checked output of the page was compared with a run.
    assert compared == [s for s in STEPS[page] if _is_checked(s)]


# ---------------------------------------------------------------------------
# The site builds


def test_the_docs_build_strictly(tmp_path):
    try:
        import mkdocs  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
        import material  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
        import mkdocstrings  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError as e:
        pytest.skip(f"{e.name} is not installed: pip install -e '.[docs]' (the py311 tox "
                    f"env installs it)")
    env = child_env(NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-5000:]
    site = tmp_path / "site"
    cli_page = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    # Generated from the parser: every command, and a flag of each kind.
    for word in ("prepare", "train", "cluster", "submit", "tune", "--preemption-grace",
                 "--package-dir", "--trial-timeout"):
        assert word in cli_page, word
    api_page = (site / "reference" / "python-api" / "index.html").read_text(encoding="utf-8")
    for name in estimator_keras.__all__:
        assert f"estimator_keras.{name}" in api_page, name
    assert (site / "benchmarks" / "published" / "full-accuracy-vs-time.png").is_file()
    assert 'class="mermaid"' in (site / "explanation" / "design" /
                                 "index.html").read_text(encoding="utf-8")
