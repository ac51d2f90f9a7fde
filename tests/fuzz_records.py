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

Usage: python tests/fuzz_records.py SEED NUM_FILE_CASES NUM_PIPELINE_CASES
"""

import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from estimator_keras import inputs, records, verify  # noqa: E402
from estimator_keras.errors import EstimatorKerasError  # noqa: E402


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


def main(argv):
    seed, n_files, n_pipes = (int(a) for a in argv[1:4])
    tf.get_logger().setLevel("ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        schema, valid_bytes, payloads = _valid(tmp)
        assert len(payloads) == 8
        print("files", file_cases(seed, n_files, tmp, valid_bytes))
        print("pipelines", pipeline_cases(seed, n_pipes, tmp, schema, valid_bytes, payloads))


if __name__ == "__main__":
    main(sys.argv)
