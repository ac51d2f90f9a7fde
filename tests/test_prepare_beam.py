"""``prepare --beam``: the same dataset as the built-in writer, written by an
Apache Beam pipeline (issue 42).

For each kind of input (a registered dataset, a folder of class folders,
image / mask pairs, other tools' TFRecords) both writers run on the same
files, and the manifests (counts, schema, class names) and the multiset of
records of each split must be equal; shard layout may differ. A folder of a
few thousand real Fashion-MNIST images is written on two Beam workers and
``train`` trains on it. The fast cases check the command line around Beam:
its options after ``--``, the message without Beam, and that the CLI loads
Beam only for ``--beam``.
"""

import collections
import os
import subprocess
import sys

import numpy as np
import pytest

from estimator_keras.manifest import load_manifest
from estimator_keras.sources.base import ArraySource
from experiments import cli
from support import FASHION, ROOT, child_env

if os.path.isdir(FASHION):
    import user_data  # its makers read Fashion-MNIST
else:
    user_data = None

CHILD_TIMEOUT = 300


def needs_fashion():
    if user_data is None:
        pytest.skip("dataset-fashion-mnist is not installed (CI installs it)")


def _prepare(*args, **variables):
    """``python -m experiments prepare ARGS`` in a child, with ``variables``
    added to its environment: (rc, stdout + stderr)."""
    env = child_env(**variables)
    env.pop("ESTIMATOR_KERAS_DATA_DIR", None)
    proc = subprocess.run([sys.executable, "-m", "experiments", "prepare", *map(str, args)],
                          cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=CHILD_TIMEOUT)
    return proc.returncode, proc.stdout


def _ok(result):
    rc, out = result
    assert rc == 0, f"exit {rc}\n{out[-4000:]}"
    return out


def _records(directory, split):
    """The serialized records of a split, as a multiset."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    found = load_manifest(directory)
    records = collections.Counter()
    for path in found.files(split):
        for record in tf.data.TFRecordDataset(path, found.compression or "").as_numpy_iterator():
            records[record] += 1
    return records


def assert_same_dataset(built_in, beam):
    """Equal manifests but for the shards and provenance; equal records per split."""
    a, b = load_manifest(built_in), load_manifest(beam)
    assert b.created["writer"] == "beam" and "writer" not in a.created
    assert a.schema == b.schema
    assert a.labels == b.labels
    assert a.compression == b.compression
    assert {s: v.num_examples for s, v in a.splits.items()} == \
        {s: v.num_examples for s, v in b.splits.items()}
    for key in ("source", "importer", "skipped", "skipped_first", "max_examples"):
        assert a.created.get(key) == b.created.get(key), key
    for split in a.splits:
        assert sum(s.num_examples for s in b.splits[split].shards) == \
            b.splits[split].num_examples
        records = _records(beam, split)
        assert sum(records.values()) == a.splits[split].num_examples > 0
        assert _records(built_in, split) == records, split


def _both(tmp_path, *args, name_flag=True, beam_args=()):
    """Runs ``prepare ARGS`` with each writer; returns the two dataset dirs."""
    dirs = []
    for writer in ("built_in", "beam"):
        data = tmp_path / writer
        extra = ["--name", "ds"] if name_flag else []
        flags = ["--beam", *beam_args] if writer == "beam" else []
        _ok(_prepare(*args, *extra, "--data-dir", data, *flags))
        dirs.append(str(data / ("ds" if name_flag else args[0])))
    return dirs


def test_beam_options_need_beam_and_other_arguments_are_still_refused(capsys, tmp_path):
    rc = cli.main(["prepare", "images", "--source-dir", str(tmp_path), "--name", "x",
                   "--data-dir", str(tmp_path), "--", "--runner", "DataflowRunner"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "(--runner DataflowRunner) are Apache Beam's, for prepare --beam; add --beam" in err
    with pytest.raises(SystemExit) as e:
        cli.main(["prepare", "images", "--name", "x", "--bem", "--", "--runner", "X"])
    assert e.value.code == 2
    assert "unrecognized arguments: --bem (did you mean --beam?)" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_without_beam_the_command_names_the_extra(tmp_path):
    # apache_beam made unimportable: what a user without the extra sees.
    code = ("import sys\nsys.modules['apache_beam'] = None\n"
            "from experiments import cli\n"
            f"sys.exit(cli.main(['prepare', 'images', '--source-dir', {str(tmp_path)!r}, "
            f"'--name', 'x', '--data-dir', {str(tmp_path)!r}, '--beam']))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    assert proc.returncode == 2, proc.stderr
    assert "prepare --beam needs Apache Beam" in proc.stderr
    assert "pip install -e '.[beam]'" in proc.stderr
    assert not (tmp_path / "x").exists()


def test_the_cli_loads_beam_only_for_beam():
    code = ("import sys\nfrom experiments import cli\n"
            "from experiments.commands import prepare as prepare_cmd\n"
            "from experiments.catalog import prepare\n"
            "cli.build_parser().parse_args(['prepare', 'images', '--name', 'x'])\n"
            "print('apache_beam' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_local_runs_default_to_the_fn_api_runner_with_num_workers():
    from apache_beam.options.pipeline_options import (  # pylint: disable=import-outside-toplevel
        DirectOptions, StandardOptions)
    from estimator_keras.sources import beam_runs  # pylint: disable=import-outside-toplevel
    options = beam_runs.pipeline_options([], num_workers=3)
    # Beam's DirectRunner would try Prism first, which downloads a binary.
    assert options.view_as(StandardOptions).runner == beam_runs.LOCAL_RUNNER
    assert options.view_as(DirectOptions).direct_num_workers == 3
    assert options.view_as(DirectOptions).direct_running_mode == "multi_processing"
    assert beam_runs.runner_name(options) == "FnApiRunner"
    given = beam_runs.pipeline_options(["--runner", "FlinkRunner", "--flink_master", "h:1"], 3)
    assert given.view_as(StandardOptions).runner == "FlinkRunner"
    assert given.view_as(DirectOptions).direct_num_workers == 1


class _BrokenDisk(ArraySource):
    """An array source whose reads fail past example ``fail_from``: a disk
    that breaks while the pipeline runs."""

    def __init__(self, arrays, fail_from):
        super().__init__(arrays)
        self.fail_from = fail_from

    def read(self, indices):
        if np.max(indices) >= self.fail_from:
            raise OSError(f"cannot read example {int(np.max(indices))}: input/output error")
        return super().read(indices)


def _files(directory):
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))}


def test_a_failed_force_rewrite_leaves_the_dataset_that_was_there(tmp_path):
    from estimator_keras import beam_write  # pylint: disable=import-outside-toplevel
    from estimator_keras.errors import DataError  # pylint: disable=import-outside-toplevel
    from estimator_keras.sources import beam_runs  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)
    arrays = {"x": rng.standard_normal((300, 3)).astype(np.float32),
              "label": rng.integers(0, 4, 300)}
    options = beam_runs.pipeline_options([], num_workers=1)
    data = tmp_path / "ds"
    beam_write.write_dataset({"train": ArraySource(arrays)}, data, options=options,
                             num_shards=3, name="ds")
    before = _files(data)
    assert sum(name.startswith("train-") for name in before) == 3
    with pytest.raises(DataError, match="input/output error") as raised:
        beam_write.write_dataset({"train": _BrokenDisk(arrays, fail_from=200)}, data,
                                 options=options, num_shards=2, name="ds")
    assert "the dataset that was there is left as it was" in str(raised.value)
    assert _files(data) == before
    assert load_manifest(str(data)).splits["train"].num_examples == 300
    # A rewrite that completes replaces every old shard, fewer of them too.
    beam_write.write_dataset({"train": ArraySource({k: v[:120] for k, v in arrays.items()})},
                             data, options=options, num_shards=2, name="ds")
    assert sorted(os.listdir(data)) == ["dataset.json", "train-00000-of-00002.tfrecord",
                                        "train-00001-of-00002.tfrecord"]
    assert load_manifest(str(data)).splits["train"].num_examples == 120


def test_a_run_on_two_workers_prints_prepares_lines_only(tmp_path):
    """The local runner's worker processes log their start (INFO, and
    WARNING lines about what a local run does not use) on the standard error
    they inherit; a normal run keeps them out of the output."""
    needs_fashion()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    out = _ok(_prepare("fashion_mnist", "--max-examples", 200, "--data-dir", tmp_path,
                       "--beam", "--num-workers", 2, TMPDIR=str(scratch)))
    assert out.splitlines() == [
        f"reading Fashion-MNIST from {FASHION} (Debian's dataset-fashion-mnist)",
        f"dataset fashion_mnist ready in {tmp_path / 'fashion_mnist'} (train 200, test 200)"], out
    assert load_manifest(str(tmp_path / "fashion_mnist")).splits["train"].num_examples == 200
    # The workers' log of a run that succeeded is removed.
    assert not [n for n in os.listdir(scratch) if n.endswith(".log")], os.listdir(scratch)


@pytest.mark.slow
def test_a_registered_dataset_is_the_same_either_way(tmp_path):
    built_in, beam = _both(tmp_path, "shapes", "--max-examples", 150, "--shards", 3,
                           name_flag=False)
    assert_same_dataset(built_in, beam)
    assert len(load_manifest(beam).splits["train"].shards) == 3


@pytest.mark.slow
def test_an_image_folder_is_the_same_either_way_and_strict_refuses(tmp_path):
    needs_fashion()
    # Mixed sizes (JPEGs of 36x36 among 28x28 PNGs): resized to raw pixels.
    folder = user_data.make_image_folder(tmp_path / "photos", per_class=12, classes=4,
                                         jpeg_every=4)
    built_in, beam = _both(tmp_path, "images", "--source-dir", folder.root,
                           "--compression", "gzip")
    assert_same_dataset(built_in, beam)
    assert load_manifest(beam).created["skipped"] == 2  # broken.png, notes.txt
    rc, out = _prepare("images", "--source-dir", folder.root, "--name", "strict",
                       "--data-dir", tmp_path / "strict", "--beam", "--strict")
    assert rc == 1 and "--strict is set" in out and "broken.png" in out, out[-2000:]
    assert not (tmp_path / "strict" / "strict" / "dataset.json").exists()


@pytest.mark.slow
def test_segmentation_pairs_are_the_same_either_way(tmp_path):
    needs_fashion()
    folder = user_data.make_segmentation_folder(tmp_path / "scans", count=40, jpeg_every=5)
    built_in, beam = _both(tmp_path, "segmentation", "--source-dir", folder.root)
    assert_same_dataset(built_in, beam)


@pytest.mark.slow
def test_a_workers_error_fails_the_command_naming_the_runner_and_the_file(tmp_path):
    from PIL import Image  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)
    for sub in ("images", "masks"):
        (tmp_path / "scans" / sub).mkdir(parents=True)
    for k in range(4):
        Image.fromarray(rng.integers(0, 256, (16, 16), dtype=np.uint8)).save(
            tmp_path / "scans" / "images" / f"{k}.png")
        mask = rng.integers(0, 3, (16, 16, 3 if k == 2 else 1), dtype=np.uint8)
        Image.fromarray(mask if k == 2 else mask[..., 0]).save(
            tmp_path / "scans" / "masks" / f"{k}.png")
    rc, out = _prepare("segmentation", "--source-dir", tmp_path / "scans", "--name", "scans",
                       "--data-dir", tmp_path / "data", "--beam")
    assert rc == 1, out[-2000:]
    assert "the Beam pipeline checking the inputs failed on FnApiRunner" in out, out[-2000:]
    assert "masks/2.png is a colour image" in out, out[-2000:]
    assert not (tmp_path / "data" / "scans" / "dataset.json").exists()


@pytest.mark.slow
def test_other_tools_tfrecords_are_the_same_either_way(tmp_path):
    needs_fashion()
    made = user_data.make_imagenet_tfrecords(tmp_path / "old", per_class=8, classes=5)
    built_in, beam = _both(tmp_path, "tfrecords", "--source", str(tmp_path / "old" / "train-*"),
                           "--image-size", 32)
    assert_same_dataset(built_in, beam)
    assert len(made.files) == 3


@pytest.mark.slow
def test_thousands_of_images_on_two_workers_then_train(tmp_path):
    needs_fashion()
    folder = user_data.make_image_folder(tmp_path / "photos", per_class=200, jpeg_every=0,
                                         bad_files=False)
    built_in, beam = _both(tmp_path, "images", "--source-dir", folder.root,
                           beam_args=("--num-workers", 2))
    assert load_manifest(beam).splits["train"].num_examples == 1800
    assert len(load_manifest(beam).splits["train"].shards) == 3
    assert_same_dataset(built_in, beam)
    env = child_env()
    env.pop("ESTIMATOR_KERAS_DATA_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-m", "experiments", "train", "image_classifier", "--dataset", "ds",
         "--data-dir", str(tmp_path / "beam"), "--model-dir", str(tmp_path / "model"),
         "--max-steps", "20", "--eval-every", "20", "--hparams", "filters=4"],
        cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, timeout=CHILD_TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert os.path.isdir(tmp_path / "model" / "export"), proc.stdout[-2000:]
