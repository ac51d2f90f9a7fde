"""The user's own code as plugins: an installed distribution's entry point,
``--module`` (before or after the command), ``EK_MODULES``, broken plugins,
names registered twice, and ``submit`` carrying the user's package, modules
and config file to the job. Real processes; no network, no cloud."""

import json
import os
import re
import shlex
import shutil
import tarfile

import mock
import pytest
import yaml

from estimator_keras.cloud import backends, packaging, submission, vertex
from estimator_keras.cloud.spec import JobSpec
from estimator_keras.errors import CloudError, ConfigError, UsageError
from experiments import cli
from experiments.commands import submit
from plugin_support import (DATASET, DISTRIBUTION, ENTRY_POINT, EXPERIMENT, MODULE,
                            install_offline, plugin_env, read_export, run_cli, write_package)

JOB_DIR = "gs://my-bucket/run1"
OURS = "gs://my-bucket/run1/packages/estimator_keras-0.1.0.tar.gz"
VERTEX = ["--project", "my-project-123", "--region", "us-central1", "--job-dir", JOB_DIR]


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """The user's package folder (setup.py with an entry point, one module)."""
    return write_package(str(tmp_path_factory.mktemp("user") / "pkg"))


@pytest.fixture(scope="module")
def site(package, tmp_path_factory):
    """The package installed offline into a folder of its own."""
    return install_offline(package, tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


def _line(out, name):
    """The `list` lines of one name (its description and details)."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.split()[:1] == [name]:
            return " ".join(lines[i:i + 2])
    raise AssertionError(f"{name} is not listed:\n{out}")


def _trains_and_exports(rc, out, err, model_dir):
    assert rc == 0, err[-3000:]
    assert "final metrics: accuracy" in out
    export = read_export(os.path.join(model_dir, "export"))
    assert export["experiment"] == EXPERIMENT
    assert export["class_names"] == ["top", "bottom"]
    assert export["metrics"]["accuracy"] > 0.9  # the stripes are easy; chance is 0.5
    assert os.path.isfile(os.path.join(model_dir, "export", "model.h5"))


# ------------------------------------------------------------- entry points


def test_an_installed_distribution_is_listed_with_its_entry_point(site, tmp_path):
    rc, out, err = run_cli("list", cwd=tmp_path, env=plugin_env(site))
    assert rc == 0, err
    origin = f"from entry point {ENTRY_POINT!r} of distribution {DISTRIBUTION}"
    assert origin in _line(out, EXPERIMENT)
    assert origin in _line(out, DATASET)
    assert "from built-in" in _line(out, "fashion_mnist_cnn")
    assert "broken" not in out
    # what a job runs: the installed package's entry point and --module of its name
    rc, out, err = run_cli("--module", MODULE, "list", cwd=tmp_path, env=plugin_env(site))
    assert rc == 0, err
    assert origin in _line(out, EXPERIMENT)


@pytest.mark.slow
def test_an_installed_distribution_trains_and_exports(site, data_dir, tmp_path):
    model_dir = str(tmp_path / "model")
    rc, out, err = run_cli("train", EXPERIMENT, "--data-dir", data_dir, "--model-dir",
                           model_dir, cwd=tmp_path, env=plugin_env(site), timeout=300)
    _trains_and_exports(rc, out, err, model_dir)


# ------------------------------------------------------------------ --module


def test_module_file_before_or_after_the_command(package, tmp_path):
    path = os.path.join(package, MODULE + ".py")
    for argv in (["--module", path, "list"], ["list", "--module", path]):
        rc, out, err = run_cli(*argv, cwd=tmp_path)
        assert rc == 0, err
        assert f"from --module {path}" in _line(out, EXPERIMENT)
        assert f"from --module {path}" in _line(out, DATASET)
    # a path relative to the working directory, and show's resolved config
    rc, out, err = run_cli("--module", os.path.relpath(path, str(tmp_path)), "show", EXPERIMENT,
                           "--hparams", "units=8", cwd=tmp_path)
    assert rc == 0, err
    shown = yaml.safe_load(out)
    assert shown["name"] == EXPERIMENT and shown["model"] == {"units": 8}
    assert shown["data"]["dataset"] == DATASET


@pytest.mark.slow
def test_module_file_trains_and_exports_without_installing(package, data_dir, tmp_path):
    model_dir = str(tmp_path / "model")
    rc, out, err = run_cli("train", EXPERIMENT, "--module", os.path.join(package, MODULE + ".py"),
                           "--data-dir", data_dir, "--model-dir", model_dir, cwd=tmp_path,
                           timeout=300)
    _trains_and_exports(rc, out, err, model_dir)


def test_ek_modules_takes_names_and_paths_comma_separated(package, tmp_path):
    extra = tmp_path / "extra_data.py"
    extra.write_text("from experiments import register_dataset\n"
                     "register_dataset('ek_extra', 'one more', lambda **_: {})\n")
    # a dotted name importable from the working directory, and a file path
    shutil.copy(os.path.join(package, MODULE + ".py"), tmp_path / "ek_env_plugin.py")
    env = plugin_env(EK_MODULES=f"ek_env_plugin, {extra}")
    rc, out, err = run_cli("list", cwd=tmp_path, env=env)
    assert rc == 0, err
    assert "from EK_MODULES ek_env_plugin" in _line(out, EXPERIMENT)
    assert str(extra) in _line(out, "ek_extra")


# ------------------------------------------------------------ broken plugins


def test_a_broken_module_is_listed_and_stops_the_other_commands(package, tmp_path):
    broken = tmp_path / "broken_plugin.py"
    broken.write_text("import numpy\nraise RuntimeError('boom: the plugin is broken')\n")
    mods = ["--module", os.path.join(package, MODULE + ".py"), "--module", str(broken)]
    rc, out, err = run_cli(*mods, "list", cwd=tmp_path)
    assert rc == 0, err
    assert "from --module" in _line(out, EXPERIMENT)  # everything else is still there
    assert "from built-in" in _line(out, "mnist_cnn")
    tail = out.split("broken plugins", 1)[1]
    assert str(broken) in tail and "RuntimeError: boom: the plugin is broken" in tail

    for command in (["show", EXPERIMENT], ["train", EXPERIMENT, "--model-dir", tmp_path / "m"],
                    ["submit", EXPERIMENT, *VERTEX, "--dry-run"]):
        rc, out, err = run_cli(*mods, *command, cwd=tmp_path)
        assert rc == 1, (command, out, err)
        assert "Traceback" not in err
        message = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(message) == 1, err
        assert str(broken) in message[0] and "RuntimeError: boom" in message[0]
        assert not os.path.exists(tmp_path / "m")

    rc, out, err = run_cli(*mods, "show", EXPERIMENT, "--verbose", cwd=tmp_path)
    assert rc == 1
    assert "Traceback" in err and "broken_plugin.py" in err


SETUP_BROKEN = ('from setuptools import setup\nsetup(name="ek-bad-plugin", version="1.0", '
                'py_modules=["ek_bad_plugin"], entry_points={"estimator_keras.experiments": '
                '["bad = ek_bad_plugin"]})\n')


def test_a_broken_entry_point_names_its_distribution(tmp_path):
    package = write_package(str(tmp_path / "bad"), source="raise ImportError('no such thing')\n",
                            setup_py=SETUP_BROKEN, module="ek_bad_plugin")
    site = install_offline(package, tmp_path / "site")
    rc, out, err = run_cli("list", cwd=tmp_path, env=plugin_env(site))
    assert rc == 0, err
    assert "from built-in" in _line(out, "fashion_mnist_cnn")
    tail = out.split("broken plugins", 1)[1]
    assert "entry point 'bad' of distribution ek-bad-plugin" in tail
    assert "ImportError: no such thing" in tail
    rc, out, err = run_cli("show", "fashion_mnist_cnn", cwd=tmp_path, env=plugin_env(site))
    assert rc == 1 and "Traceback" not in err
    assert "entry point 'bad' of distribution ek-bad-plugin" in err


# ---------------------------------------------------------- one name, twice


def test_one_name_twice_names_both_origins(package, site, tmp_path):
    path = os.path.join(package, MODULE + ".py")
    copy = tmp_path / "copy_of_plugin.py"
    copy.write_text(open(path, encoding="utf-8").read())
    rc, out, err = run_cli("--module", path, "show", EXPERIMENT, "--module", str(copy),
                           cwd=tmp_path)
    assert rc == 1
    assert "registered twice" in err and "Traceback" not in err
    assert f"--module {path}" in err and f"--module {copy}" in err

    mnist = tmp_path / "my_mnist.py"
    mnist.write_text("from experiments import register_dataset\n"
                     "register_dataset('mnist', 'my own mnist', lambda **_: {})\n")
    rc, out, err = run_cli("list", "--module", str(mnist), cwd=tmp_path)
    assert rc == 1
    assert "dataset 'mnist' is registered twice" in err
    assert "built-in" in err and f"--module {mnist}" in err

    # the installed distribution and the same file given again
    rc, out, err = run_cli("--module", path, "list", cwd=tmp_path, env=plugin_env(site))
    assert rc == 1
    assert f"entry point {ENTRY_POINT!r} of distribution {DISTRIBUTION}" in err
    assert f"--module {path}" in err


def test_one_file_given_twice_is_loaded_once(package, site, tmp_path):
    # Every spelling of one file (as `cluster` hands its tasks an absolute
    # --module beside the EK_MODULES they inherit) is one module...
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(os.path.join(package, MODULE + ".py"), work / "my_exps.py")
    os.symlink(work / "my_exps.py", tmp_path / "link_to_my_exps.py")
    for env_value, flags in (("my_exps.py", ["--module", "my_exps.py"]),
                             ("my_exps.py", ["--module", str(work / "my_exps.py")]),
                             ("./my_exps.py", ["--module", "my_exps", "--module",
                                               str(tmp_path / "link_to_my_exps.py")])):
        rc, out, err = run_cli(*flags, "list", cwd=work, env=plugin_env(EK_MODULES=env_value))
        assert rc == 0, (env_value, flags, err)
        assert f"from {' '.join(flags[:2])}" in _line(out, EXPERIMENT)
    # ... and so is the module an installed entry point names, given as a file.
    installed = os.path.join(site, MODULE + ".py")
    rc, out, err = run_cli("--module", installed, "list", cwd=tmp_path, env=plugin_env(site))
    assert rc == 0, err
    assert f"entry point {ENTRY_POINT!r} of distribution {DISTRIBUTION}" in _line(out, EXPERIMENT)


# ------------------------------------------------------------------- submit


def _dry_run(out):
    """(request, command lines) of `submit --dry-run`'s output."""
    request_text, _, rest = out.partition("\n\n")
    return json.loads(request_text), [line for line in rest.splitlines()
                                      if line and not line.startswith("#")]


def _user_sdist(package):
    name = packaging.expected_sdist_name(package)
    assert name in ("ek-stripes-plugin-0.1.tar.gz", "ek_stripes_plugin-0.1.tar.gz")
    return name


def test_submit_dry_run_carries_the_package_modules_and_config(package, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "stripes.yaml").write_text("train:\n  batch_size: 16\nmodel:\n  units: 8\n")
    pkg = os.path.relpath(package, str(work))
    # --module names what the installed package provides; it resolves here
    # from --package-dir, as it will on the job once pip installed it.
    rc, out, err = run_cli("--module", MODULE, "submit", EXPERIMENT, *VERTEX, "--workers", "1",
                           "--package-dir", pkg, "--config", "stripes.yaml", "--dry-run",
                           cwd=work)
    assert rc == 0, err
    request, commands = _dry_run(out)
    sdist = _user_sdist(package)
    user_uri = f"{JOB_DIR}/packages/{sdist}"
    pools = request["jobSpec"]["workerPoolSpecs"]
    assert len(pools) == 2
    for pool in pools:
        spec = pool["pythonPackageSpec"]
        ours, theirs = spec["packageUris"]
        assert re.match(r"gs://my-bucket/run1/packages/estimator[-_]keras-[\d.]+\.tar\.gz$", ours)
        assert theirs == user_uri
        assert spec["pythonModule"] == "experiments"
        assert spec["args"] == ["--module", MODULE, "train", EXPERIMENT,
                                "--data-dir", f"{JOB_DIR}/data",
                                "--config", f"{JOB_DIR}/config/stripes.yaml"]
    # every package's build and upload, the config's upload, then the job
    assert commands[0].split()[1:] == ["setup.py", "sdist", "--dist-dir", "dist"]
    assert shlex.split(commands[1])[:3] == ["gcloud", "storage", "cp"]
    assert commands[2].startswith(f"(cd {pkg} && ") and commands[2].endswith(
        " setup.py sdist --dist-dir dist)")
    assert shlex.split(commands[3]) == ["gcloud", "storage", "cp",
                                        os.path.join(pkg, "dist", sdist), user_uri]
    assert shlex.split(commands[4]) == ["gcloud", "storage", "cp", "stripes.yaml",
                                        f"{JOB_DIR}/config/stripes.yaml"]
    assert shlex.split(commands[5])[:4] == ["gcloud", "ai", "custom-jobs", "create"]
    assert not os.path.exists(os.path.join(package, "dist"))  # nothing was built


def test_submit_refuses_what_the_job_could_not_import(package, tmp_path):
    path = os.path.join(package, MODULE + ".py")
    cases = [
        # a file path: the job imports modules by name from the installed packages
        (["--module", path, "submit", EXPERIMENT, "--package-dir", package],
         "not a dotted module name"),
        # the user's code without the package that holds it
        (["--module", MODULE, "submit", "fashion_mnist_cnn"], "add --package-dir"),
        # an image runs as it is: it must hold the code already
        (["--module", MODULE, "submit", EXPERIMENT, "--package-dir", package,
          "--container-image", "gcr.io/p/ek:1"], "cannot go with --container-image"),
        (["submit", EXPERIMENT, "--package-dir", str(tmp_path)],
         "neither setup.py nor pyproject.toml"),
        (["--module", MODULE, "submit", EXPERIMENT, "--package-dir", package, "--config",
          str(tmp_path / "missing.yaml")], "missing.yaml"),
        # a Vertex job cannot read a local dataset folder
        (["submit", "fashion_mnist_cnn", "--dataset", str(tmp_path)], "local folder"),
    ]
    for argv, needle in cases:
        rc, out, err = run_cli(*argv, *VERTEX, "--dry-run", cwd=package)
        assert rc in (1, 2), (argv, out)
        assert needle in err, (argv, err)
        assert "Traceback" not in err
    # an experiment from an installed plugin needs its package on the job too
    site = install_offline(package, tmp_path / "site")
    rc, out, err = run_cli("submit", EXPERIMENT, *VERTEX, "--dry-run", cwd=tmp_path,
                           env=plugin_env(site))
    assert rc == 2
    assert f"entry point {ENTRY_POINT!r} of distribution {DISTRIBUTION}" in err
    assert "--package-dir" in err


def _parse(argv):
    args = cli.build_parser().parse_args(argv)
    cli._merge_global_flags(args)  # pylint: disable=protected-access
    return args


def _stub(name):
    return object()


def test_tfjob_args_carry_modules_and_config_as_given(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("EK_MODULES", raising=False)
    out_file = tmp_path / "tfjob.yaml"
    args = _parse(["--module", "my_pkg.experiments", "submit", EXPERIMENT, "--target", "tfjob",
                   "--job-dir", JOB_DIR, "--workers", "1", "--container-image",
                   "gcr.io/p/mine:1", "--config", "/app/stripes.yaml", "--output",
                   str(out_file), "--module", "/app/more.py", "--dataset", "/data/stripes"])
    assert submit.run(args, known_experiments=_stub) == 0
    manifest = yaml.safe_load(out_file.read_text())
    for role in ("Chief", "Worker"):
        (container,) = manifest["spec"]["tfReplicaSpecs"][role]["template"]["spec"][
            "containers"]
        assert container["command"] == [
            "python", "-m", "experiments", "--module", "my_pkg.experiments",
            "--module", "/app/more.py", "train", EXPERIMENT,
            "--model-dir", f"{JOB_DIR}/model", "--data-dir", f"{JOB_DIR}/data",
            "--config", "/app/stripes.yaml", "--dataset", "/data/stripes"]
    capsys.readouterr()
    with pytest.raises(UsageError, match="does not apply to --target tfjob"):
        submit.run(_parse(["submit", EXPERIMENT, "--target", "tfjob", "--job-dir", JOB_DIR,
                           "--container-image", "gcr.io/p/mine:1", "--package-dir",
                           str(tmp_path)]), known_experiments=_stub)


def test_tuning_trials_carry_modules_packages_and_config(monkeypatch, package, tmp_path,
                                                         capsys):
    monkeypatch.setenv("EK_MODULES", MODULE)
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: double, min: 0.001, max: 0.1, scale: log}\n")
    config = tmp_path / "c.json"
    config.write_text('{"train": {"batch_size": 8}}')
    args = _parse(["submit", EXPERIMENT, *VERTEX, "--package-dir", package, "--config",
                   str(config), "--tune", str(space), "--max-trials", "4", "--dry-run"])
    with mock.patch("subprocess.run") as run:
        assert submit.run(args, known_experiments=_stub) == 0
    run.assert_not_called()
    request, commands = _dry_run(capsys.readouterr().out)
    (pool,) = request["trialJobSpec"]["workerPoolSpecs"]
    spec = pool["pythonPackageSpec"]
    assert spec["packageUris"][1] == f"{JOB_DIR}/packages/{_user_sdist(package)}"
    assert spec["args"][:4] == ["--module", MODULE, "train", EXPERIMENT]
    assert spec["args"][-5:] == ["--config", f"{JOB_DIR}/config/c.json", "--tuning-trial",
                                 "--hypertune-metric", "accuracy"]
    assert shlex.split(commands[-2]) == ["gcloud", "storage", "cp", str(config),
                                         f"{JOB_DIR}/config/c.json"]


# ---------------------------------------------------- submission, for real


PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "ek-pyproject-plugin"
version = "2.0"

[tool.setuptools]
py-modules = ["ek_pyproject_plugin"]
"""


def test_submit_builds_and_uploads_each_package_and_the_config(package, tmp_path):
    # A build leaves egg-info in the folder: build a copy of the shared package.
    package = shutil.copytree(package, str(tmp_path / "pkg"))
    modern = tmp_path / "modern"
    modern.mkdir()
    (modern / "pyproject.toml").write_text(PYPROJECT)
    (modern / "ek_pyproject_plugin.py").write_text("X = 1\n")
    config = tmp_path / "run.yaml"
    config.write_text("train:\n  batch_size: 8\n")
    predicted = packaging.expected_sdist_name(str(modern))
    assert predicted in ("ek-pyproject-plugin-2.0.tar.gz", "ek_pyproject_plugin-2.0.tar.gz")

    uploaded = {}

    def upload(local, uri):
        if local.endswith(".tar.gz"):
            with tarfile.open(local) as tar:
                uploaded[uri] = sorted(os.path.basename(n) for n in tar.getnames())
        else:
            uploaded[uri] = open(local, encoding="utf-8").read()
        return uri

    submitter = mock.Mock(spec=backends.Submitter)
    submitter.upload.side_effect = upload
    submitter.create_job.return_value = {"name": "j"}
    spec = JobSpec(experiment=EXPERIMENT, job_dir=JOB_DIR, project="my-project-123",
                   region="us-central1", package_uri=OURS, modules=[MODULE],
                   package_dirs=[package, str(modern)], config=str(config))
    result = submission.submit(spec, submitter=submitter)

    first = f"{JOB_DIR}/packages/{_user_sdist(package)}"
    second = f"{JOB_DIR}/packages/{predicted}"
    assert list(uploaded) == [first, second, f"{JOB_DIR}/config/run.yaml"]
    assert MODULE + ".py" in uploaded[first] and "setup.py" in uploaded[first]
    assert "ek_pyproject_plugin.py" in uploaded[second]
    assert uploaded[f"{JOB_DIR}/config/run.yaml"] == "train:\n  batch_size: 8\n"
    (pool,) = result["request"]["jobSpec"]["workerPoolSpecs"]
    assert pool["pythonPackageSpec"]["packageUris"] == [OURS, first, second]
    assert pool["pythonPackageSpec"]["args"][:2] == ["--module", MODULE]
    assert spec.package_dirs == [package, str(modern)]  # the caller's spec is unchanged
    assert not os.path.exists(os.path.join(str(modern), "dist"))

    # two packages that would upload under one name
    submitter.reset_mock()
    with pytest.raises(CloudError, match="Two packages would upload"):
        submission.submit(JobSpec(experiment=EXPERIMENT, job_dir=JOB_DIR,
                                  project="my-project-123", region="us-central1",
                                  package_uri=OURS, package_dirs=[package, package]),
                          submitter=submitter)
    submitter.upload.assert_not_called()
    submitter.create_job.assert_not_called()


def test_a_backend_that_is_not_installed_fails_the_build_clearly(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["nope"]\nbuild-backend = "ek_no_such_backend"\n')
    with pytest.raises(CloudError, match=r"(?s)--package-dir .*failed.*ek_no_such_backend"):
        packaging.build_package_sdist(str(tmp_path), str(tmp_path / "dist"))


# ------------------------------------------------------- the job spec rules


def test_job_spec_rules_for_the_users_code():
    base = dict(experiment=EXPERIMENT, job_dir=JOB_DIR, project="my-project-123",
                region="us-central1", package_uri=OURS)
    for module in ("my_experiments.py", "pkg/my_experiments", "./pkg", "a b"):
        with pytest.raises(ConfigError, match="not a dotted module name"):
            JobSpec(modules=[module], **base).validate(for_vertex=True)
        # an image's own paths are its business
        JobSpec(modules=[module], **dict(base, package_uri=None,
                                         container_image="gcr.io/p/a:1")).validate(True)
    JobSpec(modules=["my_pkg.experiments"], **base).validate(for_vertex=True)
    with pytest.raises(ConfigError, match="cannot go with --container-image"):
        JobSpec(package_dirs=["x"], container_image="gcr.io/p/a:1",
                **dict(base, package_uri=None)).validate()
    for flag in ("--module", "--config"):
        with pytest.raises(ConfigError, match=f"must not contain {flag}"):
            JobSpec(train_args=[flag, "x"], **base).validate()
    with pytest.raises(ConfigError, match="not uploaded yet"):
        vertex.build_custom_job(JobSpec(package_dirs=["x"], **base))
    spec = JobSpec(config="conf/run.yaml", **base)
    assert spec.config_uri == f"{JOB_DIR}/config/run.yaml"
    assert JobSpec(config="gs://b/c.yaml", **base).config_uri == "gs://b/c.yaml"
    body = vertex.build_custom_job(JobSpec(extra_package_uris=["gs://my-bucket/p/u.tar.gz"],
                                           **base))
    assert body["jobSpec"]["workerPoolSpecs"][0]["pythonPackageSpec"]["packageUris"] == [
        OURS, "gs://my-bucket/p/u.tar.gz"]


def test_plugins_are_found_where_entry_points_come_as_a_dict(monkeypatch):
    # Python 3.9's importlib.metadata: entry_points() takes no group and
    # returns {group: [EntryPoint]}, whose entries have no .dist.
    import importlib.metadata  # pylint: disable=import-outside-toplevel
    from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel

    ours, theirs = object(), object()
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda: {catalog.ENTRY_POINT_GROUP: [ours], "console_scripts": [theirs]})
    assert list(catalog._plugin_entry_points()) == [ours]
