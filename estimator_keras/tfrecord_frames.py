"""TFRecord files without TensorFlow: the framing of records, written and read.

A TFRecord file is a run of records, each framed as::

    uint64 length (little-endian)
    uint32 masked CRC32C of those 8 length bytes
    length bytes of data
    uint32 masked CRC32C of the data

and a compressed file is that run of framed bytes as one gzip or zlib stream.
:class:`RecordWriter` writes files that are byte for byte what
``tf.io.TFRecordWriter`` writes (compression None, "GZIP" or "ZLIB"), to a
temporary name renamed into place on close; :func:`read_records` reads them,
checking both CRCs of every record. CRC32C comes from the ``google-crc32c``
package, imported on first use.

Paths go through :mod:`estimator_keras.io`: local files need no TensorFlow;
a ``gs://`` path is opened with ``tf.io.gfile`` there, or with fsspec where
TensorFlow is not installed.

Example::

    from estimator_keras import tfrecord_frames as frames

    with frames.RecordWriter("/tmp/a.tfrecord.gz", "GZIP") as writer:
        writer.write(b"one record")
    list(frames.read_records("/tmp/a.tfrecord.gz", "GZIP"))  # [b"one record"]
"""

import functools
import struct
import zlib

from estimator_keras import io
from estimator_keras.errors import CorruptRecordError, UsageError

_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_HEADER = _LENGTH.size + _CRC.size
_WBITS = {"GZIP": 16 + zlib.MAX_WBITS, "ZLIB": zlib.MAX_WBITS}
# TensorFlow's zlib options use memLevel 9; zlib's default (8) gives other bytes.
_MEM_LEVEL = 9
_CHUNK = 1 << 20


def check_compression(compression):
    """None, "GZIP" or "ZLIB", as TensorFlow names them ("" means None)."""
    if compression in (None, "", "NONE"):
        return None
    name = str(compression).upper()
    if name not in _WBITS:
        raise UsageError(f"TFRecord compression must be None, 'GZIP' or 'ZLIB' (as "
                         f"tf.io.TFRecordOptions names them); given {compression!r}.")
    return name


@functools.lru_cache(maxsize=None)
def _crc32c():
    """google_crc32c's ``value``, imported on first use."""
    try:
        import google_crc32c  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise UsageError(
            "reading or writing TFRecord files without TensorFlow needs CRC32C from "
            "the google-crc32c package, which is not installed: run `pip install "
            "google-crc32c` (or install estimator-keras with its `jax` extra), or "
            "read the files through TensorFlow's tf.data instead.") from e
    return google_crc32c.value


def have_crc32c():
    """Whether google-crc32c is installed: without it, reading and writing
    here raise UsageError naming it."""
    try:
        _crc32c()
    except UsageError:
        return False
    return True


def masked_crc(data):
    """TFRecord's masked CRC32C of ``data``: a CRC stored beside the bytes it
    covers, rotated and offset so that CRCs of CRCs do not look valid."""
    crc = _crc32c()(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data):
    """One record's bytes as they stand in an uncompressed TFRecord file."""
    data = bytes(data)
    length = _LENGTH.pack(len(data))
    return b"".join((length, _CRC.pack(masked_crc(length)), data,
                     _CRC.pack(masked_crc(data))))


class RecordWriter:
    """Writes one TFRecord file; a context manager.

    The records go to a temporary name beside ``path``, renamed to ``path`` by
    :meth:`close` (and on leaving a ``with`` block without an error); after an
    error, or a writer never closed, ``path`` is left as it was.
    """

    def __init__(self, path, compression=None):
        self.path = str(path)
        self.compression = check_compression(compression)
        self._deflate = (zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED,
                                          _WBITS[self.compression], _MEM_LEVEL)
                         if self.compression else None)
        self._target = io.atomic_file(self.path, "wb")
        self._file = self._target.__enter__()  # pylint: disable=unnecessary-dunder-call

    def write(self, record):
        data = frame(record)
        self._file.write(self._deflate.compress(data) if self._deflate else data)

    def close(self):
        """Finishes the file and renames it into place."""
        if self._file is None:
            return
        if self._deflate:
            try:
                self._file.write(self._deflate.flush())
            except BaseException as e:
                self.abort(e)
                raise
        self._file = None
        self._target.__exit__(None, None, None)

    def abort(self, error=None):
        """Removes the temporary file; ``path`` is left as it was."""
        if self._file is None:
            return
        self._file = None
        error = error or RuntimeError("aborted")
        self._target.__exit__(type(error), error, error.__traceback__)

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        if error is None:
            self.close()
        else:
            self.abort(error)


def write_records(path, records, compression=None):
    """Writes an iterable of byte strings to one TFRecord file, atomically;
    returns how many were written."""
    count = 0
    with RecordWriter(path, compression) as writer:
        for record in records:
            writer.write(record)
            count += 1
    return count


class _Broken(Exception):
    """The compressed stream failed; the reader adds the record and offset."""


class _Inflated:
    """The decompressed bytes of a gzip or zlib file, read a piece at a time.

    Concatenated streams read as one, as ``gzip -d`` reads them.
    """

    def __init__(self, file, compression):
        self._file, self._wbits = file, _WBITS[compression]
        self._inflate = zlib.decompressobj(self._wbits)
        self._buffer = bytearray()
        self._pending = b""
        self._started = self._done = False

    def read(self, size):
        while len(self._buffer) < size and not self._done:
            self._fill()
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def _fill(self):
        inflate = self._inflate
        if inflate.eof:
            self._pending = inflate.unused_data + self._pending
            inflate = self._inflate = zlib.decompressobj(self._wbits)
        data = inflate.unconsumed_tail or self._pending or self._file.read(_CHUNK)
        self._pending = b""
        if not data:
            if self._started and not inflate.eof:
                raise _Broken("the compressed stream ends before its end marker (the "
                              "file is truncated)")
            self._done = True
            return
        self._started = True
        try:
            self._buffer += inflate.decompress(data, _CHUNK)
        except zlib.error as e:
            raise _Broken(f"the compressed stream is damaged ({e})") from None
        if inflate.eof and not inflate.unused_data:
            self._started = False


LENGTH_DAMAGED = "the CRC of its length does not match (the length bytes are damaged)"
DATA_DAMAGED = "the CRC of its data does not match (the data bytes are damaged)"


def corrupt_record(path, index, offset, reason, compression=None, in_order=True):
    """The CorruptRecordError for record ``index`` of ``path`` at byte
    ``offset`` (of the decompressed stream when ``compression`` is given);
    ``in_order``: the file was read from its start, so the records before
    this one were checked."""
    where = f"byte {offset}" + (f" of the {compression}-decompressed stream"
                                if compression else "")
    others = ("The records before it are intact" if in_order else
              "Other records of the file may be damaged too (python -m experiments inspect "
              "--verify checks them all)")
    return CorruptRecordError(
        f"{path}: record {index} (at {where}) is corrupt: {reason}. {others}; rewrite the "
        f"file from its source.",
        path=path, offset=offset, record=index, reason=str(reason))


def _read_up_to(stream, size):
    """Up to ``size`` bytes, read a piece at a time: a damaged length field
    must not allocate what it claims before the file's end is found."""
    parts = []
    while size > 0:
        part = stream.read(min(size, _CHUNK))
        if not part:
            break
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def read_records(path, compression=None):
    """Yields the records of one TFRecord file, checking both CRCs of each.

    Raises:
      CorruptRecordError: a CRC does not match or the file ends inside a
        record; it names the file, the record's index and its byte offset
        (in the decompressed stream for a compressed file), and its
        ``reason``.
      UsageError: an unknown compression, or google-crc32c is missing.
    """
    compression = check_compression(compression)
    with io.open_file(path, "rb") as raw:
        stream = _Inflated(raw, compression) if compression else raw
        index = offset = 0
        while True:
            try:
                header = stream.read(_HEADER)
                if not header:
                    return
                if len(header) < _HEADER:
                    raise _Broken(f"the file is truncated: it ends inside the record's "
                                  f"{_HEADER}-byte header ({len(header)} bytes left)")
                length = _LENGTH.unpack_from(header)[0]
                if _CRC.unpack_from(header, _LENGTH.size)[0] != masked_crc(header[:_LENGTH.size]):
                    raise _Broken(LENGTH_DAMAGED)
                body = _read_up_to(stream, length + _CRC.size)
                if len(body) < length + _CRC.size:
                    raise _Broken(f"the file is truncated: it ends inside the record, "
                                  f"which needs {length + _CRC.size} bytes after its "
                                  f"header; {len(body)} are left")
                data = body[:length]
                if _CRC.unpack_from(body, length)[0] != masked_crc(data):
                    raise _Broken(DATA_DAMAGED)
            except _Broken as e:
                raise corrupt_record(path, index, offset, e, compression) from None
            yield data
            index += 1
            offset += _HEADER + length + _CRC.size
