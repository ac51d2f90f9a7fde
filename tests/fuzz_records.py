"""A seeded fuzzing loop over the record readers (run by test_fuzz.py in a
child process, so that a crash of the interpreter or a hang is caught too).

Every case must end in one of the documented outcomes:
- ``verify.check_file`` never raises: it returns a FileCheck;
- ``records.infer_schema`` / ``verify.inspect`` / ``records.resolve`` raise
  only EstimatorKerasError subclasses;
- iterating a ``make_dataset`` pipeline raises only ``tf.errors.OpError``
  (DataLossError for framing and CRC damage, InvalidArgumentError for records
  that do not parse to the schema) or, for a record that is not a
  tf.train.Example at all, UnicodeDecodeError (TensorFlow puts the raw bytes
  in its error message and fails to decode it, in eager and graph mode
  alike; ``train`` reports it as a DataError), and nothing at all with
  skip_corrupt.

The text parsers are fuzzed too:
- ``manifest.load_manifest`` on mutated ``dataset.json`` files (values of
  every type at every place, shard names that point elsewhere, byte damage)
  returns a Manifest or raises DataError; a manifest it accepts never names
  a file outside its directory, and ``records.resolve`` on it raises only
  DataError;
- ``--hparams`` (``hparams.parse_hparams`` + ``hparams.with_overrides`` on
  fashion_mnist_cnn's config) returns a config or raises UsageError /
  ConfigError;
- ``--config`` files (``config_files.load`` + ``config_files.apply``,
  :data:`CONFIG_FILE_PARSER`) returns a config or raises UsageError /
  ConfigError.

Usage: python tests/fuzz_records.py SEED FILE_CASES PIPELINE_CASES [MANIFEST_CASES HPARAMS_CASES
       CONFIG_CASES]
"""

import copy
import json
import os
import sys
import tempfile
import traceback

import numpy as np
import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from estimator_keras import inputs, manifest as manifest_lib, records, verify  # noqa: E402
from estimator_keras.errors import DataError, EstimatorKerasError  # noqa: E402
from experiments.catalog import loading as catalog  # noqa: E402
from experiments.catalog import registry  # noqa: E402
from experiments.config import hparams  # noqa: E402


def _parse_config_file(text, _state={}):  # pylint: disable=dangerous-default-value
    """``--config``: the file's text through config_files.load and .apply on
    fashion_mnist_cnn's config."""
    from experiments.config import files as config_files  # pylint: disable=import-outside-toplevel
    if "path" not in _state:
        _state["path"] = os.path.join(tempfile.mkdtemp(), "config.yaml")
        _state["config"] = _hparam_keys()[0]
    with open(_state["path"], "w", encoding="utf-8") as f:
        f.write(text)
    return config_files.apply(_state["config"], config_files.load(_state["path"]))


# The `--config` file parser: ``fn(text) -> config`` raising only
# EstimatorKerasError; config_file_cases() fuzzes it.
CONFIG_FILE_PARSER = _parse_config_file


def _valid(tmp):
    rng = np.random.default_rng(0)
    arrays = {"image": rng.integers(0, 255, (8, 4, 4, 1), dtype=np.uint8),
              "label": rng.integers(0, 3, 8), "score": rng.normal(size=8).astype(np.float32)}
    manifest = records.write_records(arrays, os.path.join(tmp, "valid"), num_shards=1,
                                     progress=False)
    path = manifest.files("train")[0]
    payloads = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    return manifest.schema, open(path, "rb").read(), payloads


def _mutate(rng, data):
    data = bytearray(data)
    for _ in range(rng.integers(1, 4)):
        op = rng.integers(0, 4)
        if op == 0 and data:
            data[rng.integers(0, len(data))] ^= 1 << int(rng.integers(0, 8))
        elif op == 1 and data:
            del data[rng.integers(0, len(data)):]
        elif op == 2:
            pos = rng.integers(0, len(data) + 1)
            data[pos:pos] = rng.bytes(int(rng.integers(1, 16)))
        elif data:
            pos = rng.integers(0, len(data))
            data[pos:pos + 4] = rng.bytes(4)
    return bytes(data)


def file_cases(seed, n, tmp, valid_bytes):
    rng = np.random.default_rng(seed)
    outcomes = {"ok": 0, "broken": 0, "refused": 0}
    for i in range(n):
        if i % 3 == 0:
            data = rng.bytes(int(rng.integers(0, 300)))
        else:
            data = _mutate(rng, valid_bytes)
        path = os.path.join(tmp, f"case-{i % 50}.tfrecord")
        with open(path, "wb") as f:
            f.write(data)
        check = verify.check_file(path)
        outcomes["ok" if check.ok else "broken"] += 1
        try:
            records.infer_schema(path)
            verify.inspect(path)
        except EstimatorKerasError:
            outcomes["refused"] += 1
    return outcomes


def pipeline_cases(seed, n, tmp, schema, valid_bytes, payloads):
    rng = np.random.default_rng(seed + 1)
    outcomes = {"ok": 0, "op_error": 0}
    for i in range(n):
        path = os.path.join(tmp, f"pipe-{i % 20}.tfrecord")
        if i % 2 == 0:
            with open(path, "wb") as f:
                f.write(_mutate(rng, valid_bytes))
        else:
            # Valid framing and CRCs around mutated payloads: parse errors.
            with tf.io.TFRecordWriter(path) as w:
                for p in payloads:
                    w.write(_mutate(rng, p) if rng.random() < 0.3 else p)
        files = records.RecordFiles([path], schema, None)
        for skip in (False, True):
            ds = inputs.make_dataset(files, 4, training=False, skip_corrupt=skip)
            try:
                for _ in ds:
                    pass
                outcomes["ok"] += 1
            except (tf.errors.OpError, UnicodeDecodeError):
                if skip:
                    raise
                outcomes["op_error"] += 1
    return outcomes


# --------------------------------------------------------------------------- manifests

NASTY = [None, True, False, 0, -1, 1, 3, 2 ** 31, 2 ** 64, 1.5, -0.0, "", "x", "GZIP",
         "NONE", "../x", "/etc/passwd", "gs://bucket/x", "..", ".", "a/b", "\u2028",
         "train-00000-of-00001.tfrecord", "test-00000-of-00001.tfrecord",
         "train-00000-of-00001.tfrecord.gz", "train-00000-of-00001.tfrecord\n",
         "../train-00000-of-00001.tfrecord", "/tmp/train-00000-of-00001.tfrecord",
         "train-00000-of-00001.tfrecord/../../etc", [], {}, [1, 2], [[3]], ["a"],
         {"a": 1}, {"num_classes": 2, "class_names": None}]


def _nasty(rng):
    return copy.deepcopy(NASTY[int(rng.integers(0, len(NASTY)))])


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from _paths(value, prefix + (i,))


def _mutate_tree(rng, obj):
    """A copy of the JSON object with a few values replaced, keys dropped,
    renamed or added, lists grown or emptied."""
    obj = json.loads(json.dumps(obj))
    for _ in range(int(rng.integers(1, 4))):
        paths = list(_paths(obj))
        path = paths[int(rng.integers(0, len(paths)))]
        if not path:
            if rng.random() < 0.1:
                obj = _nasty(rng)
            continue
        parent = obj
        for key in path[:-1]:
            parent = parent[key]
        key, op = path[-1], int(rng.integers(0, 5))
        if op == 0 and isinstance(parent, dict):
            del parent[key]
        elif op == 1 and isinstance(parent, dict):
            parent[str(_nasty(rng))] = parent.pop(key)
        elif op == 2 and isinstance(parent[key], list):
            value = parent[key]
            parent[key] = value + value[:1] if rng.random() < 0.5 else []
        elif op == 3 and isinstance(parent[key], int) and not isinstance(parent[key], bool):
            parent[key] += int(rng.integers(-3, 4))
        else:
            parent[key] = _nasty(rng)
    return obj


def manifest_cases(seed, n, tmp):
    """load_manifest on mutated copies of a valid manifest: a Manifest whose
    files stay in the directory, or a DataError; nothing else."""
    rng = np.random.default_rng(seed + 2)
    arrays = {"image": np.zeros((6, 2, 2, 1), np.uint8), "label": np.arange(6)}
    directory = os.path.join(tmp, "manifest-case")
    records.write_dataset({"train": arrays, "test": arrays}, directory, progress=False,
                          num_shards={"train": 2, "test": 1},
                          labels={"label": {"num_classes": 6, "class_names": None}})
    path = manifest_lib.manifest_path(directory)
    good_text = open(path).read()
    good = json.loads(good_text)
    outcomes = {"loaded": 0, "refused": 0}
    for i in range(n):
        if i % 4 == 3:
            text = _mutate(rng, good_text.encode()).decode("utf-8", "replace")
        else:
            text = json.dumps(_mutate_tree(rng, good))
        with open(path, "w") as f:
            f.write(text)
        try:
            loaded = manifest_lib.load_manifest(directory)
            for split in loaded.splits:
                for file in loaded.files(split):
                    if os.path.dirname(os.path.abspath(file)) != os.path.abspath(directory):
                        raise AssertionError(f"manifest case {i} names {file!r}:\n{text}")
                records.resolve(directory, split)
            outcomes["loaded"] += 1
        except DataError:
            outcomes["refused"] += 1
        except Exception:
            print(f"manifest case {i} crashed:\n{text}", file=sys.stderr)
            raise
    return outcomes


# --------------------------------------------------------------------------- --hparams

HPARAM_VALUES = ["", "0", "-1", "1", "3", "64", "0.5", "1e-3", "1e400", "-1e400", "nan",
                 "inf", "-inf", "true", "false", "yes", "auto", "None", "null", "1:2",
                 "a:b", ":", "=", "1_000", "0x10", " 7 ", "\x00", "\u00e9", "9" * 30, "[1]",
                 "{}", "adam", "sgd", "record", "batch"]


def _hparam_keys():
    catalog.load()
    config = registry.get("fashion_mnist_cnn").config
    fields = {f for part in (config.train, config.data) for f in vars(part)}
    return config, sorted(fields | set(config.model)) + [
        "", " ", "warp_speed", "dataset", "features", "model", "a=b", "x y", "\u540d"]


def _hparam_text(rng, keys):
    items = []
    for _ in range(int(rng.integers(0, 5))):
        key = keys[int(rng.integers(0, len(keys)))]
        value = HPARAM_VALUES[int(rng.integers(0, len(HPARAM_VALUES)))]
        items.append(f"{key}={value}" if rng.random() < 0.9 else key + value)
    return ("," if rng.random() < 0.9 else ", ,").join(items)


def hparams_cases(seed, n):
    """parse_hparams + with_overrides: a config, or UsageError / ConfigError."""
    rng = np.random.default_rng(seed + 3)
    config, keys = _hparam_keys()
    outcomes = {"applied": 0, "refused": 0}
    for i in range(n):
        text = _hparam_text(rng, keys)
        flags = {"max_steps": int(rng.integers(-2, 5))} if i % 10 == 0 else {}
        try:
            hparams.with_overrides(config, hparams.parse_hparams(text), **flags)
            outcomes["applied"] += 1
        except EstimatorKerasError:
            outcomes["refused"] += 1
        except Exception:
            print(f"--hparams case {i} crashed: {text!r} {flags}", file=sys.stderr)
            raise
    return outcomes


def _config_text(rng, keys):
    sections = {}
    for _ in range(int(rng.integers(0, 4))):
        name = ["data", "train", "model", "other", 3, None][int(rng.integers(0, 6))]
        section = {}
        for _ in range(int(rng.integers(0, 4))):
            value = (HPARAM_VALUES[int(rng.integers(0, len(HPARAM_VALUES)))]
                     if rng.random() < 0.5 else _nasty(rng))
            section[keys[int(rng.integers(0, len(keys)))]] = value
        sections[name] = section if rng.random() < 0.9 else _nasty(rng)
    text = yaml.safe_dump(sections) if rng.random() < 0.7 else json.dumps(sections)
    return _mutate(rng, text.encode()).decode("utf-8", "replace") if rng.random() < 0.2 else text


def config_file_cases(seed, n):
    """The `--config` file parser (:data:`CONFIG_FILE_PARSER`): a config, or
    UsageError / ConfigError."""
    if CONFIG_FILE_PARSER is None:
        return {"skipped": n}
    rng = np.random.default_rng(seed + 4)
    _, keys = _hparam_keys()
    outcomes = {"parsed": 0, "refused": 0}
    for i in range(n):
        text = _config_text(rng, keys)
        try:
            CONFIG_FILE_PARSER(text)
            outcomes["parsed"] += 1
        except EstimatorKerasError:
            outcomes["refused"] += 1
        except Exception:
            print(f"--config case {i} crashed:\n{text}", file=sys.stderr)
            raise
    return outcomes


def main(argv):
    seed, n_files, n_pipes = (int(a) for a in argv[1:4])
    n_manifests, n_hparams, n_configs = (int(a) for a in (argv[4:7] + ["0"] * 3)[:3])
    tf.get_logger().setLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        schema, valid_bytes, payloads = _valid(tmp)
        assert len(payloads) == 8
        print("files", file_cases(seed, n_files, tmp, valid_bytes))
        print("pipelines", pipeline_cases(seed, n_pipes, tmp, schema, valid_bytes, payloads))
        print("manifests", manifest_cases(seed, n_manifests, tmp))
        print("hparams", hparams_cases(seed, n_hparams))
        print("config_files", config_file_cases(seed, n_configs))


if __name__ == "__main__":
    main(sys.argv)
