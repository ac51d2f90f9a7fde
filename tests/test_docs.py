"""README.md and docs/ say what the code and the tests do.

- The README stays a short front page; CI runs its test command as written.
- Every ```bash and ```python block of README.md and docs/**/*.md is run here
  (a page's blocks in order, in a fresh project folder), or the line before it
  says what runs it (`<!-- run by: tests/test_x.py::test_y -->`: that test
  runs each of the block's commands, checked against the test's source below;
  or `<!-- run by: docs/PAGE.md -->`: that page's run does) or why it cannot
  run here (`<!-- not run: REASON -->`).
- Every output (```text block) is compared with a real run: of the page
  (`<!-- checked: output of the block above -->`, `<!-- checked: transcript
  -->`) or of the test that shows it (`<!-- checked by: tests/...::test_y -->`);
  how, in tests/docs_pages.py.
- The case counts of "What survives what" are the tests' own constants.
- `mkdocs build --strict` passes: no broken link, no missing page, no
  unresolved API reference.
"""

import ast
import contextlib
import importlib
import io
import os
import re
import shlex
import subprocess
import sys

import pytest

import estimator_keras
from docs_pages import (BLOCKS, DOC_PATHS, README_PATH, STEPS, Block, Setup, check_of,
                        compared_here, docs_engine, mismatch, page_steps, where)
from support import FASHION, ROOT, child_env

README = open(README_PATH, encoding="utf-8").read()
CI = open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8").read()
MAX_README_LINES = 250

RUNNABLE = {"bash", "sh", "shell", "console", "python", "py", "pycon"}
EXECUTED = {"bash", "python"}  # what an unmarked block may be
FILE_TITLE = re.compile(r"^[\w][\w.-]*(/[\w][\w.-]*)*\.\w+$")


def _rel(path):
    return os.path.relpath(path, ROOT)


_where = where


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
    assert 'tox p -- -m "not slow"' in _section("Quickstart")


def test_the_quickstart_states_one_measured_result_with_its_source():
    """One command, one result: every other measurement lives on the
    performance page. The result's accuracy is the one its published run
    printed."""
    text = _section("Quickstart")
    accuracies = re.findall(r"\b0\.9\d{2,}\b", text)
    timings = re.findall(r"\b\d+(?:\.\d+)? ?(?:min|s)\b", text)
    assert len(set(accuracies)) == 1, accuracies
    assert len(timings) <= 2, timings
    sources = re.findall(r"benchmarks/published/[\w.-]+", text)
    assert len(set(sources)) == 1, sources
    published = open(os.path.join(ROOT, sources[0]), encoding="utf-8").read()
    assert f"final metrics: accuracy {accuracies[0]}" in published
    # It is one run, of the code its transcript names, and others end elsewhere.
    flat = " ".join(text.split())
    assert "One measured run" in flat and "varies from run to run" in flat, flat
    (code,) = re.findall(r"library as (\w+)\)", published.splitlines()[0])
    assert f"(library as of {code})" in flat, (code, flat)


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
# Placeholders, "What survives what"


def test_no_placeholder_is_left():
    for path in DOC_PATHS:
        text = open(path, encoding="utf-8").read()
        assert "@@TODO" not in text and not re.search(r"@@[\w.]+@@", text), path


def _survival_rows():
    page = open(os.path.join(ROOT, "docs", "explanation", "what-survives-what.md"),
                encoding="utf-8").read()
    # The first table: one row a test (the tables after it sum the guarantees up).
    table = page[page.index("| what happened |"):]
    for line in table[:table.index("\n\n")].splitlines():
        if line.startswith("| ---") or "cases tried" in line:
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
# Every example is run or marked, every output checked


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
        if kind not in ("checked", "checked by"):
            return ("an output (```text) that nothing compares with a real run: mark it "
                    "`<!-- checked: output of the block above -->`, `<!-- checked: "
                    "transcript -->` or `<!-- checked by: tests/test_x.py::test_y -->`")
        try:
            check_of(block)
        except ValueError as e:
            return str(e)
        return None
    return f"marker {kind!r} on a ```{block.lang} block" if kind in (
        "run by", "checked", "checked by") else None


def test_every_example_is_run_or_marked():
    wrong = [f"{_where(b)}: {problem}" for b in BLOCKS if (problem := _check_marker(b))]
    assert not wrong, "\n".join(wrong)
    assert any(b.lang in EXECUTED and b.marker is None for b in BLOCKS)


def test_an_output_with_only_a_version_label_is_refused(tmp_path):
    page = tmp_path / "labelled.md"
    page.write_text('# A page\n\n```text title="estimator-keras 0.3.0, TensorFlow 2.15.1"\n'
                    "hi\n```\n", encoding="utf-8")
    (block,) = page_steps(str(page))
    assert "nothing compares" in _check_marker(block)


def test_an_output_matches_line_by_line_with_elisions_and_numbers_that_vary():
    real = "header\nstep 20/40, 5 s left\nnoise\nmore noise\ndone in 1 min 2 s\n"
    assert mismatch("header\n...\ndone in 1 min 2 s\n", real) is None
    assert mismatch("header\nstep 200/6000, 1 min 3 s left\n...\ndone in 9 s\n", real,
                    numbers_vary=True) is None
    # Numbers are exact unless they may vary; words, lines and their order never may.
    assert mismatch("header\nstep 200/6000, 1 min 3 s left\n...\n", real) is not None
    assert mismatch("header\nstage 20/40, 5 s left\n...\n", real, numbers_vary=True)
    assert mismatch("...\nnoise\nheader\n...\n", real) is not None
    assert mismatch("header\nstep 20/40, 5 s left\n", real) is not None  # lines left over
    assert mismatch("header\n...\nmissing\n...\n", real) is not None
    # A table's padding follows its widest number, but its columns stay apart.
    table = "trial  wall s  rate\n1      8       0.1\n"
    assert mismatch("trial  wall s  rate\n1      24      0.1\n", table, numbers_vary=True) is None
    assert mismatch("trial  wall s  rate\n1      24      0.1\n", table) is not None
    assert mismatch("trial  wall s  rate\n1 24 0.1\n", table, numbers_vary=True) is not None


def _run_by_targets(text):
    return [t.strip() for t in text.split(",") if t.strip()]


def _module_names(path):
    """A test file's module-level functions (FunctionDef by name), the
    literal strings, tuples and lists it assigns to names (name -> the string
    or the list of values), and its command helpers: functions ``f(*args)`` that run ``python -m
    experiments WORDS... *args`` (name -> WORDS)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    functions, sequences, helpers = {}, {}, {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = node
            prefix = _helper_prefix(node)
            if prefix is not None:
                helpers[node.name] = prefix
        elif isinstance(node, ast.Assign):
            if isinstance(node.value, (ast.Tuple, ast.List)):
                value = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
                if len(value) != len(node.value.elts):
                    continue
            elif isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                value = node.value.value
            else:
                continue
            for target in node.targets:
                if isinstance(target, ast.Name):
                    sequences[target.id] = value
    return functions, sequences, helpers


def _is_rest(element, vararg):
    """``*ARGS`` or ``*map(str, ARGS)`` of the function's ``*ARGS``."""
    if not isinstance(element, ast.Starred):
        return False
    value = element.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and \
            value.func.id == "map" and len(value.args) == 2:
        value = value.args[1]
    return isinstance(value, ast.Name) and value.id == vararg


def _helper_prefix(function):
    """The command words a ``def f(*args)`` puts before its arguments, or None."""
    vararg = function.args.vararg.arg if function.args.vararg else None
    if vararg is None:
        return None
    for item in ast.walk(function):
        elements = item.args if isinstance(item, ast.Call) else \
            item.elts if isinstance(item, (ast.List, ast.Tuple)) else []
        rest = [k for k, e in enumerate(elements) if _is_rest(e, vararg)]
        if not rest:
            continue
        words = _argv_of(elements[:rest[0]], {}) or []
        if "experiments" in words:
            words = words[words.index("experiments") + 1:]
        if words and words[0] in CLI_COMMANDS:
            return words
    return None


def _reached(name, functions, seen):
    """The function ``name`` and the module functions and fixtures it draws
    on (its parameters, the names it uses), each once."""
    if name in seen or name not in functions:
        return
    seen.add(name)
    node = functions[name]
    yield node
    used = [arg.arg for arg in node.args.args] + [n.id for n in ast.walk(node)
                                                  if isinstance(n, ast.Name)]
    for other in used:
        yield from _reached(other, functions, seen)


# A value a test computes (a temporary path, a count): see _same_command.
COMPUTED = "\x00computed"
CLI_COMMANDS = ("list", "show", "prepare", "inspect", "train", "evaluate", "export", "cluster",
                "submit", "tune")


def _argv_of(elements, sequences):
    """The words of a call's arguments or a list's items: literals as
    strings, the name of a literal module-level string as that string,
    ``*NAME`` of a literal module-level sequence spelt out, anything else
    COMPUTED. None when a ``*`` item cannot be spelt out."""
    words = []
    for element in elements:
        if isinstance(element, ast.Constant) and isinstance(element.value, (str, int, float)):
            words.append(str(element.value))
        elif isinstance(element, ast.Name) and isinstance(sequences.get(element.id), str):
            words.append(sequences[element.id])
        elif isinstance(element, ast.Starred):
            name = element.value.id if isinstance(element.value, ast.Name) else None
            if not isinstance(sequences.get(name), list):
                return None
            words += [str(v) for v in sequences[name]]
        else:
            words.append(COMPUTED)
    return words


def _test_commands(nodes, sequences, helpers):
    """Every ``python -m experiments`` command line the test functions
    ``nodes`` spell: the arguments of a call that start with a command
    (``cli("train", ...)``) or of a command helper (``prepare("images",
    ...)``), or what follows ``"-m", "experiments"`` in a call or a list."""
    found = []
    for node in nodes:
        for item in ast.walk(node):
            elements = item.args if isinstance(item, ast.Call) else \
                item.elts if isinstance(item, (ast.List, ast.Tuple)) else None
            words = _argv_of(elements or [], sequences)
            if not words:
                continue
            name = item.func.id if isinstance(item, ast.Call) and isinstance(
                item.func, ast.Name) else None
            if name in helpers:
                found.append(helpers[name] + words)
                continue
            for k in range(len(words) - 1):
                if words[k:k + 2] == ["-m", "experiments"]:
                    found.append(words[k + 2:])
                    break
            else:
                first = next((w for w in words if w not in ("--verbose",)), None)
                if first in CLI_COMMANDS or first == "--module":
                    found.append(words)
    return found


def _parsed(argv):
    """What the CLI's parser makes of ``argv``: {dest: value} with --module
    given before and after the command merged and the words it leaves to the
    command (a cluster's task flags) under "extra"; None where it refuses."""
    from experiments import cli  # pylint: disable=import-outside-toplevel
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args, extra = cli.build_parser().parse_known_args(argv)
    except SystemExit:
        return None
    found = dict(vars(args))
    found["modules"] = list(found.get("modules") or []) + list(
        found.pop("modules_after", None) or [])
    found["extra"] = extra
    return found


# The only ways a test's command may differ from the docs': it trains fewer
# steps (or evaluates at other steps), and it reads and writes its own
# temporary paths. Every other flag and value, and the command, must be the same.
STEP_DESTS = ("max_steps", "eval_every")
PATH_DESTS = ("model_dir", "data_dir", "source_dir", "source", "test_source", "log_dir",
              "export_dir", "space", "config", "path")


def _same_command(shown, ran, substitutions=True):
    """Whether the test's command ``ran`` runs the docs' ``shown`` (both argv
    lists after ``python -m experiments``): parsed alike, but for the
    substitutions above."""
    want = _parsed(shown)
    got = _parsed([w if w != COMPUTED else "computed-path" for w in ran])
    if want is None or got is None:
        return False
    for dest in set(want) | set(got):
        a, b = want.get(dest), got.get(dest)
        if a == b:
            continue
        if substitutions and dest in STEP_DESTS and b is not None:
            continue
        if substitutions and dest in PATH_DESTS and b is not None:
            continue
        return False
    return True


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


def _page_commands(page):
    """The commands a page's run executes: its setup lines, its unmarked bash
    blocks and its transcripts' `$` lines (on any engine)."""
    for step in STEPS[page]:
        if isinstance(step, Setup):
            yield from _commands(step.command)
        elif step.lang == "bash" and step.marker is None:
            yield from _commands(step.body)
        elif step.lang == "text" and check_of(step) and check_of(step).how == "transcript":
            yield from _commands("\n".join(re.findall(r"^\$ (.*)$", step.body, re.M)))


RUN_BY = [b for b in BLOCKS if b.marker and b.marker[0] == "run by"]


@pytest.mark.parametrize("block", RUN_BY, ids=_where)
def test_run_by_names_tests_that_run_the_same_commands(block):
    ran, sources, read_titles = [], "", set()
    for target in _run_by_targets(block.marker[1]):
        if target == ".ci/run":
            ci_lines = {line.strip() for line in CI.splitlines()}
            for line in block.body.splitlines():
                if line.strip() and not line.startswith("#"):
                    assert line.strip() in ci_lines, f"{_where(block)}: .ci/run lacks {line!r}"
            return
        if target in STEPS:
            assert target in RUN_PAGES, f"{_where(block)}: {target} has nothing that runs"
            ran += [(list(args), False) for args in _page_commands(target)]
            continue
        path, _, name = target.partition("::")
        full = os.path.join(ROOT, path)
        assert re.fullmatch(r"tests/test_\w+\.py", path) and os.path.isfile(full), \
            f"{_where(block)}: no test file {path}"
        functions, sequences, helpers = _module_names(full)
        fixtures, _, _ = _module_names(os.path.join(ROOT, "tests", "conftest.py"))
        if name:
            assert name in functions and name.startswith("test_"), \
                f"{_where(block)}: {path} has no test {name}"
            nodes = list(_reached(name, {**fixtures, **functions}, set()))
        else:
            nodes = [f for n, f in functions.items() if n.startswith("test_")]
        ran += [(args, True) for args in _test_commands(nodes, sequences, helpers)]
        sources += open(full, encoding="utf-8").read()
        read_titles |= {n.value for node in nodes for n in ast.walk(node)
                        if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    if block.lang == "bash":
        shown = list(_commands(block.body))
        assert shown or block.title in read_titles, \
            f"{_where(block)}: no `python -m experiments` command to check"
        for args in shown:
            assert any(_same_command(args, r, subs) for r, subs in ran), (
                f"{_where(block)}: the named tests do not run `{shlex.join(args)}`; they run:\n"
                + "\n".join(shlex.join(r) for r, _ in ran))
    elif block.lang == "python":
        if block.title and block.title in read_titles:
            return  # the tests run this very block, read by its title
        for node in ast.walk(ast.parse(block.body)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
                    "estimator_keras", "experiments"):
                for alias in node.names:
                    assert alias.name in sources, \
                        f"{_where(block)}: the named tests never use {alias.name}"


def test_the_command_check_allows_only_steps_and_paths():
    shown = ["train", "image_classifier", "--dataset", "photos", "--max-steps", "1000"]
    assert _same_command(shown, ["train", "image_classifier", "--dataset", "photos",
                                 "--max-steps", "200", "--model-dir", COMPUTED])
    for other in (["--hparams", "filters=16"], ["--batch-size", "32"], ["--engine", "keras"]):
        assert not _same_command(shown, shown + other), other
    assert not _same_command(shown, ["train", "image_classifier", "--dataset", "other",
                                     "--max-steps", "200"])
    assert not _same_command(shown, ["evaluate"] + shown[1:])
    assert not _same_command(shown, shown[:-2] + ["--max-steps", "200"], substitutions=False)


def test_checked_by_names_tests_that_compare_their_output():
    named = [b for b in BLOCKS if check_of(b) and check_of(b).how == "checked by"]
    assert named, "no output is checked by a test"
    for block in named:
        path, _, name = check_of(block).target.partition("::")
        full = os.path.join(ROOT, path)
        assert os.path.isfile(full), f"{_where(block)}: no test file {path}"
        functions, _, _ = _module_names(full)
        assert name in functions, f"{_where(block)}: {path} has no test {name}"
        calls = {n.attr if isinstance(n, ast.Attribute) else n.id
                 for node in _reached(name, functions, set()) for n in ast.walk(node)
                 if isinstance(n, (ast.Attribute, ast.Name))}
        assert "assert_shows" in calls, \
            f"{_where(block)}: {name} does not compare its output (docs_pages.assert_shows)"


# ---------------------------------------------------------------------------
# Running the pages' examples


# TensorFlow's own C++ log lines, which TensorFlow 2.21 prints on stderr at
# import on some CPUs whatever TF_CPP_MIN_LOG_LEVEL says (oneDNN's notice): a
# page's block does not print them, and no page shows them.
TF_NATIVE_LOG = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    r"STDERR|[IWE]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] .*)\n", re.M)


def _normalize(text, project):
    """The run's own names as the pages write them: ``python`` for the
    interpreter, ``$PWD`` for the page's project folder (an absolute path
    printed by a command), a time stamp as YYYYMMDD-HHMMSS; TensorFlow's
    native log lines left out (:data:`TF_NATIVE_LOG`)."""
    text = TF_NATIVE_LOG.sub("", text)
    text = text.replace(sys.executable, "python").replace(str(project / "bin" / "python"),
                                                           "python")
    text = text.replace(str(project), "$PWD")
    return re.sub(r"\d{8}-\d{6}", "YYYYMMDD-HHMMSS", text)


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


def _run(args, project, env):
    proc = subprocess.run(args, cwd=str(project), env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    return proc.returncode, proc.stdout


def _is_page_checked(step):
    return isinstance(step, Block) and step.lang == "text" and bool(check_of(step)) \
        and check_of(step).how != "checked by"


def _runs_here(step, engine):
    """Whether a page's run executes or compares ``step`` on ``engine``."""
    return isinstance(step, Block) and (
        (step.lang in EXECUTED and step.marker is None)
        or (_is_page_checked(step) and compared_here(check_of(step), engine)))


def _pages_to_run(steps_by_page):
    """The pages with something to run or compare: a setup line, an unmarked
    bash/python block, or an output checked by the page's run (a transcript
    runs its own commands)."""
    return [page for page, steps in steps_by_page.items()
            if any(isinstance(s, Setup) or _is_page_checked(s)
                   or (s.lang in EXECUTED and s.marker is None) for s in steps)]


RUN_PAGES = _pages_to_run(STEPS)


def test_every_checked_output_is_on_a_page_that_runs():
    checked = [b for b in BLOCKS if _is_page_checked(b)]
    assert checked, "no checked output in README.md or docs/"
    assert not [_where(b) for b in checked if b.path not in RUN_PAGES]


def test_a_page_whose_only_example_is_a_transcript_is_run(tmp_path):
    page = tmp_path / "transcript-only.md"
    page.write_text("# A page\n\n<!-- checked: transcript -->\n```text\n$ echo hi\nhi\n```\n",
                    encoding="utf-8")
    steps = page_steps(str(page))
    assert _pages_to_run({"transcript-only.md": steps}) == ["transcript-only.md"]


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_pages_examples_run(page, tmp_path):
    if not os.path.isdir(FASHION):
        pytest.skip("dataset-fashion-mnist is not installed (CI installs it)")
    if any(args[:1] == ["tune"] for args in _page_commands(page)) and \
            importlib.util.find_spec("optuna") is None:
        pytest.skip("the page runs `tune`, which needs the tune extra (Optuna); the "
                    "Quickstart does not install it")
    if any("--track" in args for args in _page_commands(page)) and \
            importlib.util.find_spec("mlflow") is None:
        pytest.skip("the page tracks runs with --track, which needs the mlflow extra")
    project, env = _project(tmp_path)
    engine = docs_engine()
    last, compared = None, []
    for k, step in enumerate(STEPS[page]):
        where = f"{step.path}:{step.line}"
        if isinstance(step, Setup):
            if not any(_runs_here(later, engine) for later in STEPS[page][k + 1:]):
                continue  # what it prepares is for another engine's outputs
            rc, out = _run(["bash", "-c", step.command], project, env)
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
            rc, last = _run(args, project, env)
            assert rc == 0, f"{where}: exit {rc}:\n{last[-3000:]}"
            continue
        if not _is_page_checked(step) or not compared_here(check_of(step), engine):
            continue
        check = check_of(step)
        if check.how == "output of the block above":
            assert last is not None, f"{where}: no block ran before this output"
            problem = mismatch(_normalize(step.body, project), _normalize(last, project),
                               check.numbers_vary)
            assert problem is None, \
                f"{where}: not what the block above prints now: {problem}\n{last}"
        else:
            shown = re.split(r"^\$ (.*)\n", step.body, flags=re.M)
            assert len(shown) > 1, f"{where}: a transcript without a `$ command` line"
            for command, expected in zip(shown[1::2], shown[2::2]):
                _, out = _run(["bash", "-c", command], project, env)
                problem = mismatch(_normalize(expected, project), _normalize(out, project),
                                   check.numbers_vary)
                assert problem is None, f"{where}: `{command}` now prints: {problem}\n{out}"
        compared.append(step)
    # Every output of the page shown for this engine was compared with a run.
    assert compared == [s for s in STEPS[page]
                        if _is_page_checked(s) and compared_here(check_of(s), engine)]


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


def test_tensorflow_native_log_lines_are_left_out_of_a_run_output(tmp_path):
    real = ("WARNING: All log messages before absl::InitializeLog() is called are written to "
            "STDERR\nI0000 00:00:1796326654.562911   14269 port.cc:153] oneDNN custom "
            "operations are on.\n['Ankle boot', 'Pullover']\nI0000 is not a log line\n")
    assert _normalize(real, tmp_path) == "['Ankle boot', 'Pullover']\nI0000 is not a log line\n"
