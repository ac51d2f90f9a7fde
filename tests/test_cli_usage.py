"""The command line's answers to a newcomer's slips: a mistyped flag is
refused naming the flag it is close to, a folder given as --dataset gets a
valid name to be prepared under, a model dir of another run is refused in
three short lines, and prepare writes as many shards as the data needs."""

import ast
import os

import mock
import pytest

from estimator_keras.errors import UsageError
from estimator_keras.manifest import load_manifest
from experiments import cli
from experiments.catalog import loading as catalog
from experiments.catalog import datasets
from experiments.commands import cluster as cluster_cmd
from experiments.config import files as config_files
from support import FASHION, ROOT


def _usage_error(capsys, argv):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_a_mistyped_flag_is_refused_naming_the_close_one(capsys, tmp_path):
    model_dir = tmp_path / "m"
    # argparse would take --max-step for --max-steps, and train.
    err = _usage_error(capsys, ["train", "no_such_experiment", "--model-dir", str(model_dir),
                                "--max-step", "10"])
    assert "train: error: unrecognized arguments: --max-step 10 (did you mean --max-steps?)" \
        in err
    err = _usage_error(capsys, ["evaluate", "no_such_experiment", "--model_dir", str(model_dir),
                                "--verbos"])
    assert "(did you mean --model-dir or --verbose?)" in err
    err = _usage_error(capsys, ["list", "--frobnicate"])
    assert "unrecognized arguments: --frobnicate\n" in err  # nothing close: no guess
    assert not model_dir.exists()
    args = cli.build_parser().parse_args(["train", "x", "--max-steps=10"])
    assert args.max_steps == 10


def test_cluster_names_the_close_flag_before_starting_anything(capsys, tmp_path):
    with mock.patch.object(cluster_cmd.launcher, "launch_local_cluster",
                           side_effect=AssertionError("a cluster was started")):
        rc = cli.main(["cluster", "fashion_mnist_mlp", "--workers", "0", "--model-dir",
                       str(tmp_path / "m"), "--evaluater", "--max-step", "3"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "would not accept --evaluater --max-step 3 (did you mean --evaluator or " \
           "--max-steps?)" in err
    assert not (tmp_path / "m").exists()


def _parser_calls(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and "ArgumentParser" in (
                getattr(node.func, "attr", None), getattr(node.func, "id", None)):
            yield node


def test_no_parser_takes_abbreviations(capsys):
    parser = cli.build_parser()
    assert parser.commands
    for each in [parser, *parser.commands.values()]:
        assert each.allow_abbrev is False, each.prog
    from benchmarks import cli as bench_cli  # pylint: disable=import-outside-toplevel
    with pytest.raises(SystemExit) as e:
        bench_cli.build_parser().parse_args(["--table", "input"])
    assert e.value.code == 2
    assert "(did you mean --tables?)" in capsys.readouterr().err
    # Every other parser of the checkout is made without abbreviations too.
    made = 0
    for package in ("experiments", "benchmarks", "estimator_keras"):
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in (f for f in files if f.endswith(".py")):
                for call in _parser_calls(os.path.join(folder, name)):
                    made += 1
                    given = {k.arg: k.value for k in call.keywords}.get("allow_abbrev")
                    assert isinstance(given, ast.Constant) and given.value is False, \
                        f"{package}/{name}:{call.lineno} lets argparse take abbreviations"
    assert made >= 5


def test_a_folder_given_as_dataset_gets_a_name_to_prepare_it_under(tmp_path):
    catalog.load()
    photos = tmp_path / "My Photos!"
    photos.mkdir()
    data_dir = str(tmp_path / "data")
    with pytest.raises(UsageError) as e:
        datasets.find(f"{photos}/", data_dir)
    message = str(e.value)
    assert (f"`python -m experiments prepare images --source-dir '{photos}/' --name My_Photos "
            f"--data-dir {data_dir}`, then train with --dataset My_Photos.") in message
    # A plain name keeps its name; one of a registered dataset gets a prefix.
    with pytest.raises(UsageError, match="--source-dir DIR --name flowers --data-dir"):
        datasets.find("flowers", data_dir)
    from experiments.catalog import prepare  # pylint: disable=import-outside-toplevel
    for path, name in (("/data/mnist/", "my_mnist"), ("/x/.hidden-", "hidden"),
                       ("/x/~~~", "my_data"), ("images", "my_images")):
        assert datasets.suggested_name(path) == name
        assert prepare.check_name(name) == name


def test_a_model_dir_of_another_run_is_refused_in_three_lines(tmp_path, capsys):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "config.yaml").write_text("name: fashion_mnist_mlp\nmodel:\n  units: 128\n")
    changed = [f"model.setting_{i}: {i} -> {i + 1}" for i in range(40)]
    error = config_files.refusal(str(model_dir), changed, architecture=True)
    cli._fail(error, verbose=False)  # pylint: disable=protected-access
    what, why, todo = capsys.readouterr().err.splitlines()
    assert what == (f"error: {model_dir} holds the checkpoints of another run "
                    f"(fashion_mnist_mlp), which do not fit this model.")
    assert why == (f"  Its model or data settings differ: model.setting_0, model.setting_1, "
                   f"model.setting_2 and 37 more (see {model_dir / 'config.yaml'}).")
    assert todo.startswith("  Use another --model-dir for this run")
    assert len(todo) < 100
    # One change is shown with its values.
    error = config_files.refusal(str(model_dir), ["model.units: 128 -> 64"])
    cli._fail(error, verbose=False)  # pylint: disable=protected-access
    what, why, _ = capsys.readouterr().err.splitlines()
    assert what.endswith("holds the checkpoints of another run (fashion_mnist_mlp).")
    assert why.startswith("  Its model or data settings differ: model.units: 128 -> 64 (see ")


def test_prepare_sizes_its_default_shard_count_from_the_data(tmp_path):
    if not os.path.isdir(FASHION):
        pytest.skip("dataset-fashion-mnist is not installed (CI installs it)")
    from experiments.catalog import prepare  # pylint: disable=import-outside-toplevel
    catalog.load()

    def shards(max_examples, **kwargs):
        out = prepare.prepare("fashion_mnist", str(tmp_path), max_examples=max_examples,
                              progress=False, force=True, **kwargs)
        return {s: len(v.shards) for s, v in load_manifest(out).splits.items()}

    assert shards(162) == {"train": 1, "test": 1}  # not 8 files of 20 examples
    assert shards(1600) == {"train": 3, "test": 2}
    assert shards(162, shards=4) == {"train": 4, "test": 1}  # --shards wins
    # The full datasets keep their 8 + 2.
    full = {"train": range(60000), "test": range(10000)}
    # pylint: disable-next=protected-access
    assert prepare._num_shards(full, None) == {"train": 8, "test": 2}


def test_cluster_prepares_only_a_registered_dataset_the_data_dir_lacks(tmp_path, fashion_data):
    catalog.load()
    config = catalog.registry.get("fashion_mnist_mlp").config
    for data_dir, prepared in ((fashion_data, True), (tmp_path / "empty", False)):
        assert datasets.needs_preparing("fashion_mnist", str(data_dir)) == (
            os.path.join(str(data_dir), "fashion_mnist"), not prepared)
        targs = mock.Mock(data_dir=str(data_dir), source_dir=None)
        with mock.patch.object(cluster_cmd.commands, "tensorflow_module") as module:
            cluster_cmd._prepare_missing_data(targs, config)  # pylint: disable=protected-access
        assert module.called is not prepared, data_dir
