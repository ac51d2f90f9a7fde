"""TFRecord files written and read: by :mod:`~estimator_keras.tfrecord_frames`,
or by TensorFlow where google-crc32c (its CRC32C) is missing.

Both write the same bytes and check the same CRCs; a file that is corrupt
raises :class:`~estimator_keras.errors.CorruptRecordError` naming the file,
the broken record's index and where it starts, either way.

Example::

    from estimator_keras import record_files

    with record_files.record_writer("/tmp/a.tfrecord.gz", "GZIP") as writer:
        writer.write(b"one record")
    list(record_files.read_records("/tmp/a.tfrecord.gz", "GZIP"))  # [b"one record"]
"""

import re

from estimator_keras import io, tf_optional
from estimator_keras import tfrecord_frames as frames
from estimator_keras.errors import CorruptRecordError, UsageError

# Each record is framed by its length, the length's CRC and the data's CRC.
_FRAMING_BYTES = 8 + 4 + 4


def short_tf_error(error):
    """TensorFlow's error message without its op and function-node clutter."""
    text = getattr(error, "message", str(error))
    text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", text)
    return text.split(" [Op:")[0].strip()


def framing_tensorflow():
    """None when :mod:`~estimator_keras.tfrecord_frames` frames the records
    (google-crc32c is installed), else TensorFlow, whose reader and writer
    compute the same CRCs. UsageError when neither is installed."""
    if frames.have_crc32c():
        return None
    tf = tf_optional.tensorflow()
    if tf is None:
        raise UsageError(
            "reading or writing TFRecord files needs the CRC32C of the google-crc32c "
            "package or TensorFlow's, and neither is installed: run `pip install "
            "google-crc32c` (or install estimator-keras with its `jax` extra).")
    return tf


def record_writer(path, compression=None):
    """A writer of one TFRecord file (``write(bytes)``; a context manager),
    of the bytes ``tf.io.TFRecordWriter`` writes."""
    tf = framing_tensorflow()
    if tf is None:
        return frames.RecordWriter(path, compression)
    return tf.io.TFRecordWriter(str(path), tf.io.TFRecordOptions(
        compression_type=compression or ""))


def read_records(path, compression=None):
    """Yields the records of one TFRecord file, checking both CRCs of each.

    Raises:
      CorruptRecordError: a CRC does not match or the file ends inside a
        record; with the file, the record's index, its byte offset (in the
        decompressed stream of a compressed file) and the reason.
      UsageError: neither google-crc32c nor TensorFlow is installed.
    """
    tf = framing_tensorflow()
    if tf is None:
        yield from frames.read_records(path, compression)
    else:
        yield from _tensorflow_records(tf, path, compression)


def _tensorflow_records(tf, path, compression):
    errors = (tf.errors.DataLossError, tf.errors.OutOfRangeError,
              tf.errors.InvalidArgumentError)
    dataset = tf.data.TFRecordDataset(str(path), compression or "")
    count = offset = 0
    reason = None
    try:
        # A batch at a time: a tensor per record costs more than the reading.
        for batch in dataset.batch(1024):
            for value in batch.numpy():
                yield value
                count += 1
                offset += len(value) + _FRAMING_BYTES
    except errors as e:
        reason = short_tf_error(e)
    except tf.errors.NotFoundError as e:
        raise FileNotFoundError(f"{path}: {short_tf_error(e)}") from None
    if reason is not None:
        # The failed batch hides how many of its records were good: read
        # them one by one (only broken files pay for this).
        try:
            for index, record in enumerate(dataset):
                if index >= count:
                    value = record.numpy()
                    yield value
                    count += 1
                    offset += len(value) + _FRAMING_BYTES
        except errors:
            pass
    elif not compression and io.size(path) != offset:
        # TensorFlow's reader takes a partial last record for the end of the
        # file, so a truncated file would otherwise pass as whole.
        reason = (f"truncated record at {offset}: the file is {io.size(path)} bytes but "
                  f"its {count} whole records end at byte {offset}")
    if reason is not None:
        raise CorruptRecordError(
            f"{path}: record {count} (at byte {offset}) is corrupt: {reason}. The records "
            f"before it are intact; rewrite the file from its source.",
            path=str(path), offset=offset, record=count, reason=reason)
