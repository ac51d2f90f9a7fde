"""`cluster` with the user's code: the modules given to the launcher reach
every task."""

import contextlib
import io
import os
import tempfile

import mock
import pytest

from experiments import cli
from experiments.commands import cluster as cluster_cmd
from plugin_support import DATASET, EXPERIMENT, MODULE, read_export, run_cli, write_package


class _Launched(Exception):
    """Raised by the stand-in launcher once it has seen what the tasks get."""


def cluster_forwards_modules():
    """Whether ``python -m experiments --module FILE cluster ...`` gives its
    tasks FILE (in EK_MODULES or as --module flags; relative to the working
    directory, which the tasks share, or absolute): a run of cluster_cmd.run
    with the launcher replaced, on a built-in experiment and an empty module."""
    seen = {}

    def launch(command, env=None, **kwargs):
        given = [m for m in (env or {}).get("EK_MODULES", "").split(",") if m.strip()]
        given += [b for a, b in zip(command, command[1:]) if a == "--module"]
        seen["modules"] = [os.path.abspath(m.strip()) for m in given]
        raise _Launched()

    with tempfile.TemporaryDirectory(prefix="ek-probe-") as tmp:
        module = os.path.join(tmp, "ek_probe_empty.py")
        with open(module, "w", encoding="utf-8") as f:
            f.write("")
        argv = ["--module", os.path.relpath(module), "cluster", "fashion_mnist_mlp",
                "--workers", "0", "--model-dir", os.path.join(tmp, "m"),
                "--log-dir", os.path.join(tmp, "logs"), "--max-steps", "1"]
        try:
            args, extra = cli.build_parser().parse_known_args(argv)
            cli._merge_global_flags(args)  # pylint: disable=protected-access
            with mock.patch.object(cluster_cmd.launcher, "launch_local_cluster", launch), \
                    contextlib.redirect_stdout(io.StringIO()):
                cluster_cmd.run(args, extra)
        except (Exception, SystemExit):  # pylint: disable=broad-except  (_Launched, or a failure)
            pass
        return module in seen.get("modules", [])


@pytest.mark.slow
def test_cluster_tasks_import_the_users_module(tmp_path):
    package = write_package(str(tmp_path / "pkg"))
    work = tmp_path / "work"
    work.mkdir()
    module = os.path.relpath(os.path.join(package, MODULE + ".py"), str(work))
    data_dir, model_dir, log_dir = (str(tmp_path / n) for n in ("data", "model", "logs"))
    rc, out, err = run_cli("--module", module, "prepare", DATASET, "--data-dir", data_dir,
                           cwd=work, timeout=180)
    assert rc == 0, err
    # a chief and a worker, each of which must register the user's experiment
    rc, out, err = run_cli("--module", module, "cluster", EXPERIMENT, "--workers", "1",
                           "--model-dir", model_dir, "--log-dir", log_dir, "--quiet",
                           "--timeout", "240", "--data-dir", data_dir, "--max-steps", "30",
                           "--eval-every", "30", cwd=work, timeout=300)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert sorted(os.listdir(log_dir)) == ["chief-0.log", "worker-0.log"]
    export = read_export(os.path.join(model_dir, "export"))
    assert export["experiment"] == EXPERIMENT
    assert export["class_names"] == ["top", "bottom"]


def test_cluster_passes_the_users_modules_to_its_tasks():
    # As absolute paths: the tasks may start in another directory.
    assert cluster_forwards_modules()


TWICE_PROBE = """import dataclasses
from experiments import registry
base = registry.get("fashion_mnist_mlp")
registry.register(dataclasses.replace(
    base, config=dataclasses.replace(base.config, name="ek_given_twice")))
"""


def test_cluster_checks_pass_with_a_module_also_in_ek_modules(tmp_path, monkeypatch):
    # The tasks' train command gets --module as an absolute path beside the
    # relative EK_MODULES they inherit: one file, which must load once.
    (tmp_path / "my_exps.py").write_text(TWICE_PROBE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EK_MODULES", "my_exps.py")
    argv = ["--module", "my_exps.py", "cluster", "ek_given_twice", "--workers", "0",
            "--model-dir", str(tmp_path / "m"), "--log-dir", str(tmp_path / "logs"),
            "--max-steps", "1"]
    args, extra = cli.build_parser().parse_known_args(argv)
    cli._merge_global_flags(args)  # pylint: disable=protected-access
    launched = []

    def launch(command, **kwargs):
        launched.append(command)
        raise _Launched()

    with mock.patch.object(cluster_cmd.launcher, "launch_local_cluster", launch), \
            contextlib.redirect_stdout(io.StringIO()), pytest.raises(_Launched):
        cluster_cmd.run(args, extra)
    assert launched[0][launched[0].index("--module") + 1] == str(tmp_path / "my_exps.py")
