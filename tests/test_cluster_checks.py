"""`cluster` checks what it can before it starts anything (experiment name,
engine, every flag passed on to the tasks' train), and every example that
any --help shows parses with the real parser, so that none can rot.
"""

import ast
import json
import os
import shlex
import subprocess
import sys
import textwrap

import pytest

from support import ROOT, child_env
from estimator_keras import engines
from estimator_keras.errors import ConfigError, UsageError
from experiments import cli
from experiments.catalog import loading as catalog
from experiments.catalog import registry
from experiments.commands import cluster as cluster_cmd


def run_cluster(tmp_path, *args):
    """The real CLI with TMPDIR pointing at an empty folder; returns
    (returncode, stdout, stderr, what is left in TMPDIR)."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir(exist_ok=True)
    # A bounded --timeout, should a check ever let a real cluster start.
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", "cluster", *map(str, args), "--timeout", "60"],
        cwd=ROOT,
        env=child_env(TMPDIR=str(tmp)), capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr, os.listdir(tmp)


REFUSED = [
    (["no_such_experiment"], "unknown experiment 'no_such_experiment'"),
    (["fashion_mnist_mlp", "--no-such-flag", "5"], "would not accept --no-such-flag 5"),
    (["fashion_mnist_mlp", "--hparams", "warp_speed=9"], "unknown hparam 'warp_speed'"),
    (["fashion_mnist_mlp", "--max-steps", "abc"], "invalid int value: 'abc'"),
    (["fashion_mnist_mlp", "--preemption-grace", "0"], "--preemption-grace must be a positive"),
]
REFUSED_CASES = len(REFUSED)


@pytest.mark.parametrize("args, needle", REFUSED, ids=[r[1] for r in REFUSED])
def test_refused_before_anything_starts(tmp_path, args, needle):
    model_dir = tmp_path / "m"
    rc, out, err, left = run_cluster(tmp_path, *args, "--workers", "1", "--model-dir", model_dir)
    assert rc == 2, (out, err)
    assert err.count(needle) == 1, err
    assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
    assert "Local cluster" not in out and not left and not model_dir.exists()


def test_ps_or_evaluator_with_the_keras_engine_is_refused_up_front(tmp_path):
    # --engine auto means keras on TensorFlow 2.16+; say it explicitly elsewhere.
    engine = [] if engines.auto_from_metadata() == "keras" else ["--engine", "keras"]
    rc, out, err, left = run_cluster(tmp_path, "fashion_mnist_mlp", "--workers", "1", "--ps",
                                     "1", "--evaluator", "--model-dir", tmp_path / "m", *engine)
    assert rc == 2, (out, err)
    assert "keras engine" in err and "--ps 1 and --evaluator cannot be used" in err
    assert "Local cluster" not in out and not left


def test_an_engine_this_environment_lacks_is_refused_up_front(monkeypatch, tmp_path):
    missing = "keras" if engines.auto_from_metadata() == "estimator" else "estimator"
    found = [(name, ok and name != missing, text if name != missing or not ok
              else "not available: for this test") for name, ok, text in engines.statuses()]
    monkeypatch.setattr(cluster_cmd.engines, "statuses", lambda: found)
    args, extra = parse(["cluster", "fashion_mnist_mlp", "--workers", "0", "--model-dir",
                         str(tmp_path / "m"), "--engine", missing])
    monkeypatch.setattr(cluster_cmd.launcher, "launch_local_cluster", started)
    with pytest.raises(ConfigError, match=f"--engine {missing} means the {missing} engine"):
        cluster_cmd.run(args, extra)


def test_auto_engine_comes_from_metadata_and_agrees_with_tensorflow():
    # In a fresh interpreter: TensorFlow must not be imported to decide, and
    # what it says once imported must be the same.
    code = ("import sys\n"
            "from estimator_keras import engines\n"
            "engine, imported = engines.auto_from_metadata(), 'tensorflow' in sys.modules\n"
            "print('AUTO', engine, imported, engines.resolve_engine('auto'))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("AUTO "))
    _, engine, imported, resolved = line.split()
    assert imported == "False" and engine == resolved


def started(*args, **kwargs):
    raise AssertionError("the launcher must not start")


def parse(argv):
    return cli.build_parser().parse_known_args(argv)


def test_cluster_checks_run_in_process_with_the_real_train_parser(monkeypatch, tmp_path):
    monkeypatch.setattr(cluster_cmd.launcher, "launch_local_cluster", started)
    args, extra = parse(["cluster", "fashion_mnist_mlp", "--workers", "1", "--model-dir",
                         str(tmp_path / "m"), "--hparams", "learning_rate=-1"])
    with pytest.raises(ConfigError, match="learning_rate must be positive"):
        cluster_cmd.run(args, extra)
    args, extra = parse(["cluster", "fashion_mnist_mlp", "--workers", "1", "--model-dir",
                         str(tmp_path / "m"), "--", "--units", "3"])
    with pytest.raises(UsageError, match="would not accept --units 3"):
        cluster_cmd.run(args, extra)


# --------------------------------------------------------------------------- --help examples

def _examples(text):
    """Commands shown as ``python -m experiments ...`` lines, continuation
    lines (ending in a backslash) joined."""
    lines = text.splitlines()
    found, i = [], 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("python -m experiments "):
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1].rstrip() + " " + lines[i].strip()
            found.append(line)
        i += 1
    return found


def _help_texts():
    """Every --help text, and the docstrings of the modules that implement
    the commands: cli.py, submit.py and each registered NAME_cmd.py."""
    parser = cli.build_parser()
    texts = {"--help": parser.format_help()}
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, subparser in sub.choices.items():
        texts[f"{name} --help"] = subparser.format_help()
    modules = ["cli.py"] + [f"commands/{name}.py" for name in sub.choices]
    for module in modules:
        path = os.path.join(ROOT, "experiments", module)
        if os.path.exists(path):
            doc = ast.get_docstring(ast.parse(open(path, encoding="utf-8").read())) or ""
            texts[f"experiments/{module}"] = doc
    return texts


EXAMPLES = sorted({(where, example) for where, text in _help_texts().items()
                   for example in _examples(text)})
HELP_EXAMPLE_CASES = len(EXAMPLES)


def test_help_shows_examples_of_cluster_and_submit():
    places = {where for where, _ in EXAMPLES}
    assert {"cluster --help", "experiments/commands/cluster.py"} <= places
    assert any(e.startswith("python -m experiments submit ") for _, e in EXAMPLES)


@pytest.mark.parametrize("where, example", EXAMPLES)
def test_every_help_example_parses_with_the_real_parser(where, example):
    argv = shlex.split(example)[3:]
    try:
        args, extra = parse(argv)
    except SystemExit as e:
        pytest.fail(f"{where}: {example!r} does not parse (exit {e.code})")
    if getattr(args, "modules", None) or getattr(args, "modules_after", None):
        return  # the experiment comes from the user's own module, not here
    catalog.load()
    if args.command == "cluster":
        # Name, train flags and hparams, as `cluster` checks them before it
        # starts (the engine's availability depends on this environment).
        cluster_cmd._check_train_flags(args, cluster_cmd._train_argv(args, extra))
        return
    assert not extra, f"{where}: {example!r}: unrecognized {extra}"
    if getattr(args, "name", None):
        registry.get(args.name)
    if args.command == "prepare":
        registry.dataset(args.dataset)


def test_examples_are_found_in_indented_blocks():
    text = textwrap.dedent("""\
        Example::

            python -m experiments cluster a --workers 1 \\
                --model-dir d
        and prose about python -m experiments cluster.
        """)
    assert _examples(text) == ["python -m experiments cluster a --workers 1 --model-dir d"]


USER_MODULE = '''
from experiments.catalog import models
from experiments.config import DataConfig, Experiment, ExperimentConfig
from experiments.registry import register

register(Experiment(config=ExperimentConfig(name="users_own_mlp", description="a user's",
                                            data=DataConfig(dataset="fashion_mnist"),
                                            model={"units": 8}),
                    build_model=models.seed_mlp))
'''

# The real CLI with the launcher replaced: prints the tasks' command.
PRINT_COMMAND = r'''
import json, sys
from estimator_keras.distribute import launcher
from experiments import cli
def fake(command, **kwargs):
    print("COMMAND", json.dumps(command), flush=True)
    return launcher.ClusterResult({"chief-0": 0}, {"chief-0": "c.log"}, {"chief-0": 1}, (),
                                  0.1, ".")
launcher.launch_local_cluster = fake
sys.exit(cli.main(sys.argv[1:]))
'''


def test_experiments_of_the_users_modules_are_checked_and_passed_on(tmp_path):
    module = tmp_path / "my_experiments.py"
    module.write_text(USER_MODULE)
    proc = subprocess.run(
        [sys.executable, "-c", PRINT_COMMAND, "--module", str(module), "cluster",
         "users_own_mlp", "--workers", "0", "--model-dir", str(tmp_path / "m"),
         "--log-dir", str(tmp_path / "logs"), "--hparams", "units=4"],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(l for l in proc.stdout.splitlines() if l.startswith("COMMAND "))
    command = json.loads(line[len("COMMAND "):])
    assert command[3:5] == ["train", "users_own_mlp"]
    assert command[command.index("--module") + 1] == str(module)
    # Without the module the name is unknown, and nothing starts.
    rc, out, err, _ = run_cluster(tmp_path, "users_own_mlp", "--workers", "0", "--model-dir",
                                  tmp_path / "m2")
    assert rc == 2 and "unknown experiment 'users_own_mlp'" in err
