"""Random access to the records of TFRecord shards, without TensorFlow.

A TFRecord file has no index, so :class:`ShardedRecords` builds one: the byte
offset of every record, found by reading each 12-byte header (its length
CRC checked) and seeking past the data. A gzip or zlib stream cannot be
entered in the middle, so a compressed shard is decompressed once into an
uncompressed copy, checked record by record as it is read, and the copy is
indexed. Indexes and copies are cached per user in
``$XDG_CACHE_HOME/estimator-keras/record-index/`` (owner-only folders),
keyed by the shard's path, size and modification time and checked by SHA-256
when reused; anything that does not match is rebuilt. Reads check both CRCs
of every record. The object is what Grain calls a ``RandomAccessDataSource``;
pickled to worker processes, it carries the index, and each process opens the
files it reads on first use.

Example::

    from estimator_keras import records, record_index

    found = records.resolve("/data/fashion", split="train")
    data = record_index.ShardedRecords(found.files, found.compression)
    len(data), data[17], data.read_many([5, 3, 900])
"""

import bisect
import hashlib
import json
import logging
import mmap
import os
import shutil
import struct
import tempfile
import threading
import weakref

import numpy as np

from estimator_keras import io
from estimator_keras import tfrecord_frames as frames
from estimator_keras.errors import DataError

logger = logging.getLogger(__name__)

_HEAD = struct.Struct("<QI")  # data length, masked CRC of the length's 8 bytes
_CRC = struct.Struct("<I")
_FRAMING = _HEAD.size + _CRC.size
_VERSION = 1
# One read covers adjacent records of a batch up to this many bytes.
_RUN_BYTES = 8 << 20


def offsets(path, compression=None):
    """The byte offset of each record's header in ``path`` (its decompressed
    stream when compressed), then the end offset: N + 1 int64s.

    Every length CRC is checked; the data of an uncompressed file is skipped
    over, not read. Raises CorruptRecordError as ``read_records`` does.
    """
    compression = frames.check_compression(compression)
    if compression:
        return _decompressed(path, compression)[0]
    size, ends = io.size(path), [0]
    with io.open_file(path, "rb") as f:
        while ends[-1] < size:
            start, header = ends[-1], f.read(_HEAD.size)
            length, crc = _HEAD.unpack(header) if len(header) == _HEAD.size else (None, None)
            if length is None:
                reason = (f"the file ends inside the record's {_HEAD.size}-byte header "
                          f"({len(header)} bytes left)")
            elif crc != frames.masked_crc(header[:8]):
                reason = frames.LENGTH_DAMAGED
            elif start + _FRAMING + length > size:
                reason = (f"the file ends inside the record: it needs {length + _CRC.size} "
                          f"bytes after its header, {size - start - _HEAD.size} are left")
            else:
                ends.append(start + _FRAMING + length)
                f.seek(ends[-1])
                continue
            raise frames.corrupt_record(path, len(ends) - 1, start, reason)
    return np.array(ends, dtype=np.int64)


def _decompressed(path, compression, out=None):
    """(offsets, SHA-256 of the framed bytes) of a compressed shard, whose
    records (both CRCs checked by read_records) are framed into ``out``."""
    ends, digest = [0], hashlib.sha256()
    for data in frames.read_records(path, compression):
        ends.append(ends[-1] + len(data) + _FRAMING)
        if out is not None:
            framed = frames.frame(data)
            out.write(framed)
            digest.update(framed)
    return np.array(ends, dtype=np.int64), digest.hexdigest()


def cache_folder(cache_dir=None):
    """The cache's folder (created owner-only), or None when it cannot be
    used: not writable, or another user's or writable by others."""
    if cache_dir is None:
        base = os.environ.get("XDG_CACHE_HOME", "")
        if not os.path.isabs(base):  # as the XDG spec says: a relative one is ignored
            base = os.path.join(os.path.expanduser("~"), ".cache")
        cache_dir = os.path.join(base, "estimator-keras", "record-index")
    folder = os.path.abspath(cache_dir)
    try:
        missing, parent = [], folder
        while not os.path.isdir(parent):
            missing.append(parent)
            parent = os.path.dirname(parent)
        for path in reversed(missing):
            os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.stat(folder)
        # The checksums catch damage, not forgery: trust only a folder no one else writes.
        if info.st_uid != getattr(os, "getuid", lambda: info.st_uid)() or info.st_mode & 0o022:
            raise PermissionError(f"{folder} belongs to another user or others may write it")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise PermissionError(f"{folder} is not writable")
    except OSError as e:
        logger.debug("record index cache unusable, indexing without it: %s", e)
        return None
    return folder


def _key(path, compression):
    """What a cached index must have been built from."""
    path = str(path) if io.is_remote(path) else os.path.abspath(path)
    return {"path": path, "size": io.size(path), "mtime_ns": io.mtime_ns(path),
            "compression": compression, "version": _VERSION}


def _sha256_of_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _load(base, key):
    """The offsets cached at ``base + ".index"`` if built from ``key`` and
    intact (and, for a compressed shard, its copy too); else None."""
    try:
        with open(base + ".index", "rb") as f:
            head, _, array = f.read().partition(b"\n")
        header = json.loads(head)
        if any(header.get(name) != value for name, value in key.items()):
            raise ValueError("built from another version of the shard")
        if (hashlib.sha256(array).hexdigest() != header["sha256"]
                or len(array) != 8 * (header["count"] + 1)):
            raise ValueError("its checksum does not match")
        ends = np.frombuffer(array, dtype="<i8").astype(np.int64)
        if ends[0] != 0 or np.any(np.diff(ends) < _FRAMING):
            raise ValueError("its offsets are out of order")
        if key["compression"] and (os.path.getsize(base + ".tfrecord") != ends[-1] or
                                   _sha256_of_file(base + ".tfrecord") != header["copy"]):
            raise ValueError("the decompressed copy's checksum does not match")
        return ends
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.debug("ignoring the cached record index %s.index: %s", base, e)
        return None


def _save(base, key, ends, copy_digest=None):
    array = ends.astype("<i8").tobytes()
    header = dict(key, count=len(ends) - 1, sha256=hashlib.sha256(array).hexdigest(),
                  copy=copy_digest)
    try:
        with io.atomic_file(base + ".index", "wb") as f:
            f.write(json.dumps(header, sort_keys=True).encode() + b"\n" + array)
    except OSError as e:
        logger.debug("cannot cache the record index %s.index: %s", base, e)


class ShardedRecords:
    """The records of ``files`` (in that order, file after file) by global index.

    Args:
      files: the shards' paths, local or remote.
      compression: None, "GZIP" or "ZLIB", for every file.
      counts: records per file from the manifest, or None; a file that holds
        another number is a DataError.
      cache_dir: where indexes and decompressed copies are kept (default:
        the per-user XDG cache); without a usable one, compressed shards are
        decompressed into a private temporary folder removed with this object.
    """

    def __init__(self, files, compression=None, counts=None, cache_dir=None):
        self._open_state()  # first: close() and __del__ need it
        self.files = [str(f) for f in files]
        self.compression = frames.check_compression(compression)
        if counts is not None and len(counts) != len(self.files):
            raise DataError(f"{len(counts)} record counts given for {len(self.files)} files: "
                            f"the manifest must list one count per shard.")
        self._temp, self._finalizer = None, None
        folder = cache_folder(cache_dir)
        # File f's offsets are _ends[_starts[f] + f:_starts[f + 1] + f + 1]; _starts[f]
        # is the global index of its first record (a list: bisect beats numpy on one).
        self._sources, ends, self._starts = [], [], [0]
        for i, path in enumerate(self.files):
            source, found = self._index(path, folder)
            if counts is not None and int(counts[i]) != len(found) - 1:
                raise DataError(f"{path}: the manifest says it holds {int(counts[i])} records, "
                                f"the file holds {len(found) - 1}; the shard was rewritten "
                                f"without its manifest: write the dataset again.")
            self._sources.append(source)
            ends.append(found)
            self._starts.append(self._starts[-1] + len(found) - 1)
        self._ends = np.concatenate(ends) if ends else np.zeros(0, np.int64)

    def _index(self, path, folder):
        """(the file to read, its offsets), from the cache when it holds them."""
        key = _key(path, self.compression)
        name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
        base = os.path.join(folder, name) if folder else None
        ends = _load(base, key) if base else None
        if ends is not None:
            return (base + ".tfrecord" if self.compression else path), ends
        if self.compression:
            source = os.path.join(folder or self._temp_dir(), name + ".tfrecord")
            with io.atomic_file(source, "wb") as out:
                ends, copy_digest = _decompressed(path, self.compression, out)
        else:
            source, ends, copy_digest = path, offsets(path), None
        if base and _key(path, self.compression) == key:  # not changed while read
            _save(base, key, ends, copy_digest)
        return source, ends

    def _temp_dir(self):
        if self._temp is None:
            self._temp = tempfile.mkdtemp(prefix="estimator-keras-records-")
            # Only the process that made it removes it, not the workers it is pickled to.
            self._finalizer = weakref.finalize(self, shutil.rmtree, self._temp, True)
        return self._temp

    def _open_state(self):
        self._handles, self._views = {}, {}
        self._lock, self._pid = threading.Lock(), os.getpid()

    def __getstate__(self):
        state = dict(self.__dict__)
        for name in ("_handles", "_views", "_lock", "_pid", "_finalizer"):
            state.pop(name, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state, _finalizer=None)
        self._open_state()

    def __len__(self):
        return self._starts[-1]

    @property
    def counts(self):
        """Records per file, in ``files``' order."""
        return [end - start for start, end in zip(self._starts, self._starts[1:])]

    def __repr__(self):
        return (f"ShardedRecords({len(self.files)} files, {len(self)} records, "
                f"compression={self.compression!r}, first={self.files[:1]})")

    def file_of(self, index):
        """(position of the file in ``files``, index of the record in it)."""
        position = int(index)
        if position < 0:
            position += len(self)
        if not 0 <= position < len(self):
            raise IndexError(f"record index {index} is out of range: there are {len(self)}")
        f = bisect.bisect_right(self._starts, position) - 1
        return f, position - self._starts[f]

    def __getitem__(self, index):
        f, r = self.file_of(index)
        at = self._starts[f] + f + r
        begin, end = int(self._ends[at]), int(self._ends[at + 1])
        return self._record(f, r, begin, end, self._read(f, begin, end), 0)

    def read_many(self, indices):
        """The records of ``indices``, in that order. A local file is read
        through a memory map (no system call per record); a remote one's
        records are read in file order, adjacent ones in one read."""
        positions = np.asarray(indices, dtype=np.int64).reshape(-1)
        count = len(self)
        positions = np.where(positions < 0, positions + count, positions)
        if positions.size and not (0 <= positions.min() and positions.max() < count):
            bad = next(int(i) for i, p in zip(np.asarray(indices).reshape(-1), positions)
                       if not 0 <= p < count)
            raise IndexError(f"record index {bad} is out of range: there are {count}")
        files = np.searchsorted(self._starts, positions, side="right") - 1
        out = [None] * len(positions)
        for f in np.unique(files).tolist():
            slots = np.flatnonzero(files == f)
            local = positions[slots] - self._starts[f]
            view = self._view(f)
            if view is None:
                for slot, record in zip(slots.tolist(), self._read_runs(f, local.tolist())):
                    out[slot] = record
                continue
            ends = self._file_ends(f)
            for slot, r, begin, end in zip(slots.tolist(), local.tolist(),
                                           ends[local].tolist(), ends[local + 1].tolist()):
                out[slot] = self._record(f, r, begin, end, view[begin:end], 0)
        return out

    def _file_ends(self, f):
        """File ``f``'s record offsets, then its end."""
        return self._ends[self._starts[f] + f:self._starts[f + 1] + f + 1]

    def _read_runs(self, f, local):
        """Records ``local`` of file ``f``, in that order, read in runs of
        adjacent records."""
        ends, runs = self._file_ends(f).tolist(), []  # [first record, last record]
        for r in sorted(set(local)):
            if runs and runs[-1][1] == r - 1 and ends[r + 1] - ends[runs[-1][0]] <= _RUN_BYTES:
                runs[-1][1] = r
            else:
                runs.append([r, r])
        found = {}
        for first, last in runs:
            data = self._read(f, ends[first], ends[last + 1])
            for r in range(first, last + 1):
                found[r] = self._record(f, r, ends[r], ends[r + 1], data, ends[r] - ends[first])
        return [found[r] for r in local]

    def _view(self, f):
        """A read-only memory map of local file ``f`` (None: remote, or empty)."""
        handle = self._handle(f)
        if not isinstance(handle, int):
            return None
        view = self._views.get(f)
        if view is None and self._starts[f + 1] > self._starts[f]:
            with self._lock:
                view = self._views.get(f)
                if view is None:
                    view = self._views[f] = mmap.mmap(handle, 0, access=mmap.ACCESS_READ)
        return view

    # Grain's batched reads (SupportsBatchedReadRandomAccessDataSource).
    _getitems = read_many

    def _read(self, f, start, end):
        handle = self._handle(f)
        if isinstance(handle, int):
            return os.pread(handle, end - start, start)
        file, lock = handle
        with lock:
            file.seek(start)
            return file.read(end - start)

    def _handle(self, f):
        """File ``f``'s descriptor (local: pread needs no lock) or (file, lock)."""
        if self._pid != os.getpid():  # forked: the parent's handles are not ours
            self._open_state()
        handle = self._handles.get(f)
        if handle is None:
            with self._lock:
                handle = self._handles.get(f)
                if handle is None:
                    path = self._sources[f]
                    handle = ((io.open_file(path, "rb"), threading.Lock()) if io.is_remote(path)
                              else os.open(path, os.O_RDONLY))
                    self._handles[f] = handle
        return handle

    def _record(self, f, r, begin, end, data, at):
        """Record ``r`` of file ``f`` (bytes ``begin`` to ``end``, at ``at`` in
        ``data``), both CRCs checked."""
        length, crc = _HEAD.unpack_from(data, at) if len(data) >= at + end - begin else (None, 0)
        if length is None:
            reason = "the file ends inside the record (it is shorter than when it was indexed)"
        elif crc != frames.masked_crc(data[at:at + 8]):
            reason = frames.LENGTH_DAMAGED
        elif length != end - begin - _FRAMING:
            reason = "its length differs from the index (the file changed since it was indexed)"
        else:
            record = data[at + _HEAD.size:at + _HEAD.size + length]
            if _CRC.unpack_from(data, at + _HEAD.size + length)[0] == frames.masked_crc(record):
                return record
            reason = frames.DATA_DAMAGED
        if self.compression:
            reason += (f", in its decompressed copy {self._sources[f]} (delete the copy to "
                       f"decompress the shard again)")
        # Records are read by index: the ones before were not all checked.
        raise frames.corrupt_record(self.files[f], r, begin, reason, self.compression,
                                    in_order=False)

    def close(self):
        """Closes the files this process opened; reads reopen them."""
        with self._lock:
            handles, self._handles = self._handles, {}
            views, self._views = self._views, {}
        if self._pid != os.getpid():
            return
        for view in views.values():
            view.close()
        for handle in handles.values():
            if isinstance(handle, int):
                os.close(handle)
            else:
                handle[0].close()

    def __del__(self):
        try:
            self.close()
        except (AttributeError, TypeError):  # at interpreter exit, modules are torn down
            pass
