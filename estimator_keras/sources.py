"""Example sources: readers of source formats that the dataset writer consumes.

Every source here follows one small protocol, which is all
:func:`estimator_keras.records.write_dataset` needs::

    source.features          # ordered {name: FeatureSpec}: the schema of its examples
    len(source)              # number of examples
    source.read(indices)     # {name: np.ndarray}, first axis len(indices), in that order

``indices`` is a 1-D integer array in any order and may repeat. Features
encoded ``png``, ``jpeg`` or ``bytes`` come back as ``dtype=object`` arrays
holding ``bytes``.

Sources are pickled into spawned worker processes, so they keep only paths
and small metadata in their state and open files lazily; reading touches only
the requested examples, so memory stays flat whatever the dataset's size.

Sources provided:

- :class:`ArraySource`: in-memory numpy arrays;
- :class:`IdxSource`: MNIST / Fashion-MNIST IDX files (see :func:`read_idx`,
  :func:`find_idx_files`, :func:`download_idx`);
- :class:`ImageFolderSource`: one sub-folder of images per class;
- :class:`SegmentationFolderSource`: image / mask pairs matched by file stem;
- :class:`ShapesSource`: a generated segmentation set (shapes on noise).

Example::

    images, labels = find_idx_files(DEBIAN_FASHION_MNIST_DIR, "train")
    source = IdxSource(images, labels)
    batch = source.read(np.array([5, 0, 5]))
    batch["image"].shape   # (3, 28, 28, 1), uint8
"""

import functools
import gzip
import hashlib
import logging
import os
import struct
import sys
import tempfile
import uuid
import zlib

import numpy as np

from estimator_keras.errors import DataError, SchemaError, UsageError
from estimator_keras.schema import FeatureSpec, spec_for_array

logger = logging.getLogger(__name__)

DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
"""Where the Debian package ``dataset-fashion-mnist`` installs the IDX files."""

SHAPES_CLASSES = ("background", "circle", "rectangle", "triangle")
"""Class names of :class:`ShapesSource` masks; the index is the pixel value."""

IDX_IMAGES_MAGIC = 0x00000803  # uint8, 3 dims: (count, rows, cols)
IDX_LABELS_MAGIC = 0x00000801  # uint8, 1 dim: (count,)

# IDX type codes (third byte of the magic number); data is big-endian.
_IDX_DTYPES = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_IDX_CODES = {dt.newbyteorder("=").name: code for code, dt in _IDX_DTYPES.items()}

# The URLs keras.datasets.fashion_mnist / keras.datasets.mnist (Keras 2.15)
# download from, with the sha256 Keras pins for mnist.npz.
_KERAS_DATASETS_URL = "https://storage.googleapis.com/tensorflow/tf-keras-datasets/"
_IDX_GZ_FILES = ("train-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz",
                 "t10k-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz")
_MNIST_NPZ = "mnist.npz"
_MNIST_NPZ_SHA256 = "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"

_IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
_COPY_CHUNK = 1 << 20


# --------------------------------------------------------------------------
# Small helpers shared by the sources.

def _tf():
    # TensorFlow takes seconds to import; only the paths that need it pay.
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf


def _read_errors():
    """Exceptions a failed read raises: OSError, plus TF's when TF is loaded
    (``tf.io.gfile`` reports a missing or unreadable remote file with them)."""
    tf = sys.modules.get("tensorflow")
    return (OSError, tf.errors.OpError) if tf is not None else (OSError,)


def _is_remote(path):
    return "://" in str(path)


def _open_rb(path):
    if _is_remote(path):
        return _tf().io.gfile.GFile(path, "rb")
    return open(path, "rb")


def _exists(path):
    return _tf().io.gfile.exists(path) if _is_remote(path) else os.path.exists(path)


def _isdir(path):
    return _tf().io.gfile.isdir(path) if _is_remote(path) else os.path.isdir(path)


def _listdir(path):
    if _is_remote(path):
        return sorted(name.rstrip("/") for name in _tf().io.gfile.listdir(path))
    return sorted(os.listdir(path))


def _join(directory, name):
    if _is_remote(directory):
        return directory.rstrip("/") + "/" + name
    return os.path.join(directory, name)


def _stat(path):
    """(size in bytes, modification time in ns) of a local or remote file."""
    if _is_remote(path):
        st = _tf().io.gfile.stat(path)
        return st.length, st.mtime_nsec
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _atomic_write(path, data):
    """Writes ``data`` to a temporary name next to ``path``, then renames, so a
    crash never leaves a half-written file under the final name."""
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    if _is_remote(path):
        gfile = _tf().io.gfile
        with gfile.GFile(tmp, "wb") as f:
            f.write(data)
        gfile.rename(tmp, path, overwrite=True)
        return
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _as_indices(indices, length, source):
    """Validates ``indices`` for ``source.read`` and returns them as int64."""
    idx = np.asarray(indices)
    if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise UsageError(
            f"{type(source).__name__}.read expects a 1-D array of integer indices; "
            f"got an array of dtype {idx.dtype} and shape {idx.shape}.")
    idx = idx.astype(np.int64, copy=False)
    if idx.size and (idx.min() < 0 or idx.max() >= length):
        bad = idx[(idx < 0) | (idx >= length)][0]
        raise IndexError(
            f"{type(source).__name__}.read: index {bad} is out of range; the "
            f"source holds {length} examples (valid indices 0..{length - 1}).")
    return idx


def _preview(items, limit=10):
    items = list(items)
    shown = ", ".join(str(i) for i in items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


class _Source:
    """Shared plumbing: length, repr, and pickling without open handles.

    Subclasses list in ``_TRANSIENT`` the ``__dict__`` entries (memmaps,
    cached grids) that are rebuilt lazily and must not travel in a pickle.
    """

    _TRANSIENT = ()

    def __len__(self):
        return self._num_examples

    def __getstate__(self):
        state = dict(self.__dict__)
        for key in self._TRANSIENT:
            state.pop(key, None)
        return state

    def __repr__(self):
        names = ", ".join(self.features)
        return f"<{type(self).__name__}: {len(self)} examples, features: {names}>"


# --------------------------------------------------------------------------
# Arrays.

class ArraySource(_Source):
    """Examples held as numpy arrays whose first axis is examples.

    Args:
      arrays: dict feature name -> array; all arrays must have the same first
        axis length.
      encodings: optional dict feature name -> encoding, overriding the one
        :func:`estimator_keras.schema.spec_for_array` infers.

    Example::

        source = ArraySource({"x": np.zeros((10, 4), np.float32),
                              "y": np.arange(10)})
        source.read(np.array([3, 1]))["y"]   # array([3, 1])
    """

    def __init__(self, arrays, encodings=None):
        if not isinstance(arrays, dict) or not arrays:
            raise UsageError(
                "ArraySource expects a non-empty dict of feature name -> numpy "
                f"array; got {type(arrays).__name__}"
                f"{' (empty)' if isinstance(arrays, dict) else ''}.")
        encodings = dict(encodings or {})
        unknown = sorted(set(encodings) - set(arrays))
        if unknown:
            raise UsageError(
                f"ArraySource: encodings were given for {unknown}, which are not "
                f"among the arrays' features {sorted(arrays)}.")
        self._arrays = {name: np.asarray(a) for name, a in arrays.items()}
        self.features = {name: spec_for_array(name, a, encodings.get(name))
                         for name, a in self._arrays.items()}
        lengths = {name: a.shape[0] for name, a in self._arrays.items()}
        if len(set(lengths.values())) > 1:
            listing = ", ".join(f"{name!r}: {n}" for name, n in lengths.items())
            raise DataError(
                "ArraySource: every array must hold the same number of examples "
                f"along its first axis, but the lengths differ ({listing}).")
        self._num_examples = int(next(iter(lengths.values())))

    def read(self, indices):
        """The examples at ``indices``, as {name: array}; see the module docstring."""
        idx = _as_indices(indices, len(self), self)
        out = {}
        for name, array in self._arrays.items():
            values = array[idx]
            if self.features[name].encoding in ("bytes", "png", "jpeg"):
                values = _to_bytes_objects(values, name)
            out[name] = values
        return out


def _to_bytes_objects(values, name):
    """An object array of ``bytes``: what the writer expects for byte features."""
    out = np.empty(values.shape, dtype=object)
    flat_in, flat_out = values.reshape(-1), out.reshape(-1)
    for i, v in enumerate(flat_in):
        if isinstance(v, str):
            flat_out[i] = v.encode("utf-8")
        elif isinstance(v, (bytes, bytearray, memoryview)):
            flat_out[i] = bytes(v)
        else:
            # bytes(5) would silently give five zero bytes.
            raise SchemaError(f"feature {name!r} is stored as bytes, but holds a "
                              f"{type(v).__name__} ({v!r:.50}); expected str or bytes.")
    return out


# --------------------------------------------------------------------------
# IDX (MNIST / Fashion-MNIST).

class _IdxHeader:
    """Parsed IDX header: magic number, element dtype, shape, header length."""

    def __init__(self, magic, dtype, shape, offset):
        self.magic, self.dtype, self.shape, self.offset = magic, dtype, shape, offset

    @property
    def data_bytes(self):
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    @property
    def total_bytes(self):
        return self.offset + self.data_bytes

    def describe(self):
        return (f"magic 0x{self.magic:08X}: {self.dtype.newbyteorder('=').name} "
                f"array of shape {tuple(self.shape)}")


def _open_idx(path):
    """A binary stream of the IDX file's (decompressed) bytes."""
    raw = _open_rb(path)
    if str(path).endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    return raw


def _read_exact(f, n, path, what):
    data = f.read(n)
    if len(data) < n:
        raise DataError(
            f"IDX file {path} is truncated: it ends inside its {what} "
            f"({len(data)} of {n} bytes present).")
    return data


def _parse_idx_header(f, path, expected_magic=None):
    head = _read_exact(f, 4, path, "magic number")
    zero0, zero1, code, ndim = head
    magic = int.from_bytes(head, "big")
    wanted = ""
    if expected_magic is not None:
        meaning = {IDX_IMAGES_MAGIC: "images: uint8, 3 dims",
                   IDX_LABELS_MAGIC: "labels: uint8, 1 dim"}.get(expected_magic, "")
        wanted = f" (expected 0x{expected_magic:08X}{', ' + meaning if meaning else ''})"
    if zero0 or zero1 or code not in _IDX_DTYPES or ndim == 0:
        raise DataError(
            f"{path} is not an IDX file: its magic number is 0x{magic:08X}, but an "
            f"IDX magic number is two zero bytes, a type code (one of "
            f"{', '.join(f'0x{c:02X}' for c in _IDX_DTYPES)}) and a dimension "
            f"count{wanted}. Is it the right file, and is a .gz file named "
            f"with .gz?")
    if expected_magic is not None and magic != expected_magic:
        raise DataError(
            f"IDX file {path} has magic number 0x{magic:08X}"
            f" ({_IDX_DTYPES[code].newbyteorder('=').name}, {ndim} dims){wanted}. "
            f"Were the images and labels files swapped?")
    dims = _read_exact(f, 4 * ndim, path, "dimension sizes")
    shape = tuple(int(d) for d in struct.unpack(f">{ndim}I", dims))
    return _IdxHeader(magic, _IDX_DTYPES[code], shape, 4 + 4 * ndim)


def _wrap_stream_errors(path, fn):
    """Runs ``fn`` and turns gzip / zlib failures into a DataError naming ``path``."""
    try:
        return fn()
    except EOFError as e:
        raise DataError(f"IDX file {path} is truncated: the compressed stream ends "
                        f"early ({e}). Download or copy it again.") from e
    except (gzip.BadGzipFile, zlib.error) as e:
        raise DataError(f"{path} is named .gz but is not a valid gzip stream "
                        f"({e}). Download or copy it again, or drop the .gz "
                        f"suffix if it is not compressed.") from e


def read_idx(path, magic=None):
    """Reads a whole IDX file (``.gz`` or not) into a native-endian numpy array.

    Args:
      path: the file; a name ending in ``.gz`` is decompressed on the fly.
      magic: if given, the magic number the file must have, e.g.
        :data:`IDX_IMAGES_MAGIC` (0x00000803) or :data:`IDX_LABELS_MAGIC`
        (0x00000801).

    Raises:
      DataError: naming the file, when the magic number is not an IDX one (or
        not ``magic``), or the data is shorter or longer than the header says.

    Example::

        labels = read_idx("/usr/share/datasets/fashion-mnist/"
                          "t10k-labels-idx1-ubyte.gz")   # (10000,) uint8
    """
    path = str(path)

    def read():
        with _open_idx(path) as f:
            header = _parse_idx_header(f, path, magic)
            # Grow a buffer instead of allocating what the header claims: a
            # garbage header could claim terabytes.
            buf = bytearray()
            while len(buf) < header.data_bytes:
                chunk = f.read(min(_COPY_CHUNK * 16, header.data_bytes - len(buf)))
                if not chunk:
                    break
                buf += chunk
            if len(buf) < header.data_bytes:
                raise DataError(
                    f"IDX file {path} is truncated: its header ({header.describe()}) "
                    f"announces {header.data_bytes} bytes of data but only "
                    f"{len(buf)} follow.")
            if f.read(1):
                raise DataError(
                    f"IDX file {path} does not match its header: the header "
                    f"({header.describe()}) announces {header.data_bytes} bytes of "
                    f"data but more follow. The file may be a concatenation or "
                    f"the wrong format.")
            return np.frombuffer(buf, dtype=header.dtype).reshape(header.shape)
    array = _wrap_stream_errors(path, read)
    return array.astype(array.dtype.newbyteorder("="), copy=False)


def write_idx(path, array):
    """Writes ``array`` as an IDX file (gzip-compressed when ``path`` ends in .gz).

    The dtype must be one the IDX format knows (uint8, int8, int16, int32,
    float32, float64); a uint8 array of 3 dims gets the images magic number
    0x00000803 and a uint8 vector the labels one 0x00000801. Written to a
    temporary name and renamed.
    """
    array = np.asarray(array)
    name = array.dtype.newbyteorder("=").name
    if name not in _IDX_CODES or not 1 <= array.ndim <= 255:
        raise UsageError(
            f"write_idx({path}): IDX holds arrays of 1 to 255 dims of dtype "
            f"{', '.join(_IDX_CODES)}; got {name} of shape {array.shape}.")
    code = _IDX_CODES[name]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + np.ascontiguousarray(array, dtype=_IDX_DTYPES[code]).tobytes()
    if str(path).endswith(".gz"):
        # mtime=0: the same array always gives the same bytes.
        data = gzip.compress(data, mtime=0)
    _atomic_write(str(path), data)


def _default_cache_dir():
    return os.path.join(tempfile.gettempdir(), "estimator_keras_idx_cache")


def _idx_local_file(path, magic, cache_dir):
    """Validates an IDX file and returns (local uncompressed path, header).

    A local uncompressed file is used in place. A ``.gz`` or remote file is
    streamed once into ``cache_dir`` under a name keyed by its path, size and
    mtime, so later calls (and worker processes) reuse it and memory stays flat.
    """
    path = str(path)
    if not _exists(path):
        raise DataError(f"IDX file {path} does not exist.")
    if not _is_remote(path) and not path.endswith(".gz"):
        with open(path, "rb") as f:
            header = _parse_idx_header(f, path, magic)
        size = os.path.getsize(path)
        if size != header.total_bytes:
            what = "is truncated" if size < header.total_bytes else "is longer than its header says"
            raise DataError(
                f"IDX file {path} {what}: its header ({header.describe()}) "
                f"implies {header.total_bytes} bytes in all, but the file has "
                f"{size}.")
        return path, header

    cache_dir = cache_dir or _default_cache_dir()
    os.makedirs(cache_dir, exist_ok=True)
    size, mtime = _stat(path)
    key = hashlib.sha256(f"{os.path.abspath(path) if not _is_remote(path) else path}"
                         f"|{size}|{mtime}".encode()).hexdigest()[:16]
    base = os.path.basename(path.rstrip("/"))
    base = base[:-3] if base.endswith(".gz") else base
    cached = os.path.join(cache_dir, f"{base}.{key}")

    def stream():
        with _open_idx(path) as f:
            header = _parse_idx_header(f, path, magic)
            if os.path.exists(cached) and os.path.getsize(cached) == header.total_bytes:
                return header
            tmp = f"{cached}.tmp-{uuid.uuid4().hex}"
            try:
                with open(tmp, "wb") as out:
                    out.write(header.magic.to_bytes(4, "big")
                              + struct.pack(f">{len(header.shape)}I", *header.shape))
                    remaining = header.data_bytes
                    while remaining:
                        chunk = f.read(min(_COPY_CHUNK, remaining))
                        if not chunk:
                            raise DataError(
                                f"IDX file {path} is truncated: its header "
                                f"({header.describe()}) announces "
                                f"{header.data_bytes} bytes of data but only "
                                f"{header.data_bytes - remaining} follow.")
                        out.write(chunk)
                        remaining -= len(chunk)
                if f.read(1):
                    raise DataError(
                        f"IDX file {path} does not match its header: the header "
                        f"({header.describe()}) announces {header.data_bytes} "
                        f"bytes of data but more follow.")
                # Concurrent writers produce identical bytes, so the last
                # rename winning is harmless.
                os.replace(tmp, cached)
            finally:
                if os.path.exists(tmp):
                    os.remove(tmp)
            return header

    header = _wrap_stream_errors(path, stream)
    logger.debug("IDX %s cached uncompressed at %s", path, cached)
    return cached, header


class IdxSource(_Source):
    """MNIST-format (IDX) images and labels, memory-mapped.

    Features: ``image_feature`` uint8 of shape (rows, cols, 1) encoded
    ``raw`` (28x28x1 for MNIST and Fashion-MNIST) and ``label_feature`` an
    int64 scalar encoded ``int64``.

    Args:
      images_path, labels_path: IDX files (magic 0x00000803 and 0x00000801),
        ``.gz`` or not, local or any ``tf.io.gfile`` path.
      image_feature, label_feature: feature names.
      cache_dir: where ``.gz`` and remote files are decompressed once (default:
        a folder in the system temp dir); uncompressed local files are
        memory-mapped in place.

    Example::

        source = IdxSource(*find_idx_files(DEBIAN_FASHION_MNIST_DIR, "test"))
        len(source)   # 10000
    """

    _TRANSIENT = ("_images_map", "_labels_map")

    def __init__(self, images_path, labels_path, image_feature="image",
                 label_feature="label", cache_dir=None):
        if image_feature == label_feature:
            raise UsageError(f"IdxSource: image_feature and label_feature are both "
                             f"{image_feature!r}; give them different names.")
        self.images_path, self.labels_path = str(images_path), str(labels_path)
        self.cache_dir = cache_dir
        self._images_file, self._images_header = _idx_local_file(
            self.images_path, IDX_IMAGES_MAGIC, cache_dir)
        self._labels_file, self._labels_header = _idx_local_file(
            self.labels_path, IDX_LABELS_MAGIC, cache_dir)
        n_images, n_labels = self._images_header.shape[0], self._labels_header.shape[0]
        if n_images != n_labels:
            raise DataError(
                f"IDX images {self.images_path} hold {n_images} examples but labels "
                f"{self.labels_path} hold {n_labels}; they must be the same split "
                f"of the same dataset.")
        self._num_examples = n_images
        rows, cols = self._images_header.shape[1:]
        self.image_feature, self.label_feature = image_feature, label_feature
        self.features = {
            image_feature: FeatureSpec(image_feature, "uint8", (rows, cols, 1), "raw"),
            label_feature: FeatureSpec(label_feature, "int64", (), "int64"),
        }

    def _map(self, which):
        local, header = (
            (self._images_file, self._images_header) if which == "images"
            else (self._labels_file, self._labels_header))
        if not os.path.exists(local):
            # A cache in the temp dir may be cleaned between pickling and use.
            source = self.images_path if which == "images" else self.labels_path
            magic = IDX_IMAGES_MAGIC if which == "images" else IDX_LABELS_MAGIC
            local, header = _idx_local_file(source, magic, self.cache_dir)
        return np.memmap(local, dtype=np.uint8, mode="r", offset=header.offset,
                         shape=header.shape)

    @functools.cached_property
    def _images_map(self):
        return self._map("images")

    @functools.cached_property
    def _labels_map(self):
        return self._map("labels")

    def read(self, indices):
        """The examples at ``indices``, as {name: array}; see the module docstring."""
        idx = _as_indices(indices, len(self), self)
        images = np.asarray(self._images_map[idx], dtype=np.uint8)
        labels = np.asarray(self._labels_map[idx], dtype=np.int64)
        shape = self.features[self.image_feature].shape
        return {self.image_feature: images.reshape(len(idx), *shape),
                self.label_feature: labels}


def find_idx_files(source_dir, split):
    """Finds the (images, labels) IDX files of ``split`` in ``source_dir``.

    ``split`` is ``"train"`` (files ``train-*``) or ``"test"`` (files
    ``t10k-*``). Both the canonical names (``train-images-idx3-ubyte``) and the
    dotted variant (``train-images.idx3-ubyte``) are accepted, each with or
    without ``.gz``; an uncompressed file wins because it is memory-mapped in
    place.

    Raises:
      UsageError: for an unknown split.
      DataError: listing the names looked for when a file is missing.
    """
    prefixes = {"train": "train", "test": "t10k"}
    if split not in prefixes:
        raise UsageError(f"find_idx_files: split must be 'train' or 'test'; got {split!r}.")
    source_dir = str(source_dir)
    if not _isdir(source_dir):
        raise DataError(
            f"IDX source directory {source_dir} does not exist. Give the folder "
            f"holding the MNIST-format files (for Fashion-MNIST, "
            f"`apt-get install dataset-fashion-mnist` puts them in "
            f"{DEBIAN_FASHION_MNIST_DIR}).")
    prefix = prefixes[split]
    found, missing = [], []
    for kind, ndim in (("images", 3), ("labels", 1)):
        stems = (f"{prefix}-{kind}-idx{ndim}-ubyte", f"{prefix}-{kind}.idx{ndim}-ubyte")
        names = [stem + ext for stem in stems for ext in ("", ".gz")]
        hit = next((n for n in names if _exists(_join(source_dir, n))), None)
        if hit is None:
            missing.append(f"{kind} (looked for {', '.join(names)})")
        else:
            found.append(_join(source_dir, hit))
    if missing:
        raise DataError(
            f"the {split} split's IDX files are missing from {source_dir}: "
            f"{'; '.join(missing)}.")
    return found[0], found[1]


def download_idx(dataset, dest_dir):
    """Downloads ``"mnist"`` or ``"fashion_mnist"`` as four IDX ``.gz`` files.

    Uses ``tf.keras.utils.get_file`` with the URLs Keras' own
    ``keras.datasets`` loaders use. Fashion-MNIST is published as the four IDX
    files; MNIST only as ``mnist.npz`` (checked against Keras' sha256), which is
    rewritten as the four IDX files. Files already in ``dest_dir`` are reused.
    Needs the internet.

    Returns:
      ``dest_dir``, ready for :func:`find_idx_files`.

    Raises:
      UsageError: for an unknown dataset.
      DataError: when the download fails (offline, blocked, bad hash).
    """
    if dataset not in ("mnist", "fashion_mnist"):
        raise UsageError(f"download_idx: dataset must be 'mnist' or 'fashion_mnist'; "
                         f"got {dataset!r}.")
    dest_dir = os.path.abspath(str(dest_dir))
    os.makedirs(dest_dir, exist_ok=True)
    get_file = _tf().keras.utils.get_file
    names = _IDX_GZ_FILES if dataset == "fashion_mnist" else (_MNIST_NPZ,)
    current = names[0]
    try:
        paths = []
        for current in names:
            # An absolute cache_subdir makes get_file save exactly in dest_dir.
            kwargs = {"file_hash": _MNIST_NPZ_SHA256} if current == _MNIST_NPZ else {}
            paths.append(get_file(current, origin=_KERAS_DATASETS_URL + current,
                                  cache_dir=dest_dir, cache_subdir=dest_dir, **kwargs))
    # get_file raises a bare Exception on URL errors, so nothing narrower works.
    except Exception as e:  # pylint: disable=broad-except
        raise DataError(
            f"downloading {dataset} failed while fetching "
            f"{_KERAS_DATASETS_URL + current} into {dest_dir} ({type(e).__name__}: "
            f"{e}). Without internet access, point --source-dir at a folder that "
            f"already holds the IDX files; for Fashion-MNIST, `apt-get install "
            f"dataset-fashion-mnist` installs them in {DEBIAN_FASHION_MNIST_DIR}.") from e
    if dataset == "mnist":
        try:
            with np.load(paths[0], allow_pickle=False) as f:
                splits = {"train": (f["x_train"], f["y_train"]),
                          "t10k": (f["x_test"], f["y_test"])}
        except (OSError, KeyError, ValueError) as e:
            raise DataError(f"the downloaded {paths[0]} is not the expected MNIST "
                            f"archive ({e}); delete it and download again.") from e
        for prefix, (images, labels) in splits.items():
            write_idx(os.path.join(dest_dir, f"{prefix}-images-idx3-ubyte.gz"),
                      images.astype(np.uint8))
            write_idx(os.path.join(dest_dir, f"{prefix}-labels-idx1-ubyte.gz"),
                      labels.astype(np.uint8))
    return dest_dir


# --------------------------------------------------------------------------
# Encoded images (PNG / JPEG) in folders.

class _BadImage(Exception):
    """Raised by the header probe; turned into a DataError naming the file."""


class _ImageInfo:
    """What an image file's header says, read without decoding the pixels."""

    def __init__(self, fmt, height, width, channels, depth=8, palette=False):
        self.fmt, self.height, self.width = fmt, height, width
        # Channels a plain decode gives, or None when TF would convert
        # (palette PNGs, CMYK JPEGs): such files are always re-encoded.
        self.channels = channels
        self.depth = depth  # bits per sample
        self.palette = palette

    @property
    def eight_bit(self):
        return self.depth == 8


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_PNG_CHANNELS = {0: 1, 2: 3, 3: None, 4: 2, 6: 4}


def _probe_image(path):
    """Reads the PNG or JPEG header of ``path``: format, size, channels."""
    try:
        with _open_rb(path) as f:
            head = f.read(32)
            if head.startswith(_PNG_SIGNATURE):
                if len(head) < 26 or head[12:16] != b"IHDR":
                    raise _BadImage("its PNG header is incomplete")
                width, height = struct.unpack(">II", head[16:24])
                depth, color = head[24], head[25]
                if color not in _PNG_CHANNELS or width == 0 or height == 0:
                    raise _BadImage(f"its PNG header is invalid (colour type {color}, "
                                    f"size {width}x{height})")
                return _ImageInfo("png", height, width, _PNG_CHANNELS[color],
                                  depth, palette=color == 3)
            if head[:2] == b"\xff\xd8":
                return _probe_jpeg(f)
            raise _BadImage("it is neither a PNG nor a JPEG (unrecognised first bytes)")
    except _read_errors() as e:
        raise _BadImage(f"it cannot be read ({e})") from e


def _probe_jpeg(f):
    # Walk the marker segments up to the frame header (SOFn), skipping EXIF
    # and other application segments by their length fields.
    pos = 2
    while True:
        f.seek(pos)
        marker = f.read(2)
        if len(marker) < 2 or marker[0] != 0xFF:
            raise _BadImage("its JPEG markers are broken before the frame header")
        code = marker[1]
        pos += 2
        if code == 0xFF:  # fill byte
            pos -= 1
            continue
        if code in (0x01, 0xD8) or 0xD0 <= code <= 0xD7:
            continue  # markers without a length
        if code in (0xD9, 0xDA):
            raise _BadImage("it has no JPEG frame header before its image data")
        length = f.read(2)
        if len(length) < 2:
            raise _BadImage("it is truncated inside its JPEG header")
        seglen = struct.unpack(">H", length)[0]
        if seglen < 2:
            raise _BadImage("its JPEG header has an invalid segment length")
        if 0xC0 <= code <= 0xCF and code not in (0xC4, 0xC8, 0xCC):
            frame = f.read(6)
            if len(frame) < 6:
                raise _BadImage("it is truncated inside its JPEG frame header")
            _, height, width, comps = struct.unpack(">BHHB", frame)
            if height == 0 or width == 0:
                raise _BadImage(f"its JPEG frame header gives size {width}x{height}")
            return _ImageInfo("jpeg", height, width, comps if comps in (1, 3) else None)
        pos += seglen


def _probe_all(paths):
    infos = []
    for path in paths:
        try:
            infos.append(_probe_image(path))
        except _BadImage as e:
            raise DataError(f"image {path} is unreadable or corrupt: {e}. Remove or "
                            f"replace it.") from e
    return infos


def _list_images(directory):
    """Sorted image file names (by extension) in ``directory``, and the others."""
    images, others = [], []
    for name in _listdir(directory):
        if name.startswith("."):
            continue
        if os.path.splitext(name)[1].lower() in _IMAGE_EXTENSIONS:
            images.append(name)
        elif not _isdir(_join(directory, name)):
            others.append(name)
    return images, others


def _native_ok(info, channels):
    """True when the file's bytes decode, unconverted, to uint8 with ``channels``."""
    return info.channels == channels and info.eight_bit


def _choose_encoding(infos, channels, size=None):
    """Picks the feature's encoding and which files must be re-encoded.

    Files are stored byte for byte when they all share one format and decode
    to the wanted channels (and size). Otherwise the feature becomes PNG and
    only the files that are not already such PNGs are decoded and re-encoded:
    PNG is lossless, whereas re-encoding to JPEG would degrade every image a
    second time.
    """
    def fits(info):
        return _native_ok(info, channels) and (
            size is None or (info.height, info.width) == size)

    formats = {info.fmt for info in infos}
    if size is None and len(formats) == 1 and all(fits(i) for i in infos):
        return formats.pop(), np.zeros(len(infos), dtype=bool)
    reencode = np.array([not (i.fmt == "png" and fits(i)) for i in infos], dtype=bool)
    return "png", reencode


def _check_same_size(paths, infos, hint):
    first = infos[0]
    odd = [f"{p} ({i.height}x{i.width})" for p, i in zip(paths, infos)
           if (i.height, i.width) != (first.height, first.width)]
    if odd:
        raise DataError(
            f"images must all have the same size; {paths[0]} is {first.height}x"
            f"{first.width} (height x width) but {len(odd)} differ: {_preview(odd, 5)}. "
            f"{hint}")


def _image_bytes(path, reencode, channels, size, verify, expected):
    """The stored bytes of one image: the file itself, or a PNG re-encoding.

    With ``verify`` the file is decoded even when stored as is, so a corrupt
    image fails here, naming the file, instead of in the training input
    pipeline.
    """
    with _open_rb(path) as f:
        data = f.read()
    if not (reencode or verify):
        return data
    tf = _tf()
    try:
        image = tf.io.decode_image(data, channels=channels if reencode else 0,
                                   expand_animations=False)
    except (tf.errors.InvalidArgumentError, ValueError) as e:
        raise DataError(f"image {path} is unreadable or corrupt: decoding failed "
                        f"({str(e).splitlines()[0][-200:]}). Remove or replace it.") from e
    if reencode:
        if size is not None and tuple(image.shape[:2]) != tuple(size):
            resized = tf.image.resize(image, size, method="bilinear", antialias=True)
            image = tf.cast(tf.clip_by_value(tf.round(resized), 0, 255), tf.uint8)
        data = tf.io.encode_png(image).numpy()
    elif tuple(image.shape) != tuple(expected):
        raise DataError(f"image {path} decodes to shape {tuple(image.shape)}, but its "
                        f"header promised {tuple(expected)}; the file is corrupt.")
    return data


def _image_size_arg(image_size):
    if image_size is None:
        return None
    size = (image_size, image_size) if np.isscalar(image_size) else tuple(image_size)
    if len(size) != 2 or not all(isinstance(s, (int, np.integer)) and s > 0 for s in size):
        raise UsageError(f"image_size must be a positive int or (height, width); "
                         f"got {image_size!r}.")
    return tuple(int(s) for s in size)


def _channels_arg(channels):
    if channels not in (1, 3):
        raise UsageError(f"channels must be 1 (grayscale) or 3 (RGB); got {channels!r}.")
    return channels


class ImageFolderSource(_Source):
    """Image classification data: one sub-folder of PNG / JPEG files per class.

    Class ids follow the sorted sub-folder names (``class_names[i]`` is class
    ``i``). Images stay encoded: feature ``image`` (encoding ``png`` or
    ``jpeg``, shape (height, width, channels)) and ``label`` (int64).

    Without ``image_size`` all images must have the same size, taken from the
    first one, and are stored byte for byte when they share one format; mixed
    formats (or files whose channels differ from ``channels``) make the feature
    PNG, re-encoding only the files that need it. With ``image_size`` images are
    decoded, resized and stored as PNG.

    Args:
      root: folder of class folders (local or ``tf.io.gfile`` path).
      image_size: None, an int, or (height, width).
      channels: 1 or 3.
      verify: decode every image while reading, so a corrupt file is reported
        by name when the dataset is written rather than during training.

    Example::

        source = ImageFolderSource("flowers/", image_size=96)
        source.class_names   # ['daisy', 'roses', ...]
    """

    def __init__(self, root, image_size=None, channels=3, verify=True):
        self.root = str(root)
        self.channels = _channels_arg(channels)
        self.image_size = _image_size_arg(image_size)
        self.verify = bool(verify)
        if not _isdir(self.root):
            raise DataError(f"image folder {self.root} does not exist or is not a folder.")
        class_names = [n for n in _listdir(self.root)
                       if not n.startswith(".") and _isdir(_join(self.root, n))]
        if not class_names:
            raise DataError(
                f"image folder {self.root} holds no class sub-folders; expected one "
                f"folder per class (e.g. {self.root}/cat/*.png, {self.root}/dog/*.png).")
        files, labels, ignored = [], [], 0
        for label, name in enumerate(class_names):
            images, others = _list_images(_join(self.root, name))
            ignored += len(others)
            if not images:
                raise DataError(
                    f"class folder {_join(self.root, name)} holds no images (.png, .jpg, "
                    f".jpeg)"
                    f"{'; it holds ' + _preview(others, 5) if others else ''}. Remove "
                    f"it or add images.")
            files.extend(f"{name}/{img}" for img in images)
            labels.extend([label] * len(images))
        if ignored:
            logger.warning("ImageFolderSource %s: ignored %d files that are not "
                           ".png/.jpg/.jpeg", self.root, ignored)
        self.class_names = class_names
        self._files = files
        self._labels = np.asarray(labels, dtype=np.int64)
        self._num_examples = len(files)

        paths = [self._path(i) for i in range(len(files))]
        infos = _probe_all(paths)
        if self.image_size is None:
            _check_same_size(paths, infos, "Pass image_size to resize them all.")
            height, width = infos[0].height, infos[0].width
        else:
            height, width = self.image_size
        self._encoding, self._reencode = _choose_encoding(infos, self.channels, self.image_size)
        if self._reencode.any():
            logger.info("ImageFolderSource %s: %d of %d images will be re-encoded as PNG",
                        self.root, int(self._reencode.sum()), len(files))
        self.features = {
            "image": FeatureSpec("image", "uint8", (height, width, self.channels), self._encoding),
            "label": FeatureSpec("label", "int64", (), "int64"),
        }

    def _path(self, i):
        class_name, name = self._files[i].split("/", 1)
        return _join(_join(self.root, class_name), name)

    def read(self, indices):
        """The examples at ``indices``, as {name: array}; see the module docstring."""
        idx = _as_indices(indices, len(self), self)
        images = np.empty(len(idx), dtype=object)
        shape = self.features["image"].shape
        for k, i in enumerate(idx):
            images[k] = _image_bytes(self._path(i), self._reencode[i], self.channels,
                                     self.image_size, self.verify, shape)
        return {"image": images, "label": self._labels[idx]}


class SegmentationFolderSource(_Source):
    """Segmentation data: images and masks in two folders, paired by file stem.

    ``images_dir/cat_01.jpg`` pairs with ``masks_dir/cat_01.png``. Feature
    ``image`` keeps the images' encoding (``png`` or ``jpeg``; PNG when mixed,
    re-encoding as :class:`ImageFolderSource` does) and feature ``mask`` is a
    PNG of shape (height, width, 1) whose pixel values are class ids. All
    images must have one size, and each mask its image's size.

    Masks must be grayscale PNGs of any bit depth (or RGB PNGs whose channels
    are equal) holding ids up to 255: JPEG would blur class ids, and TensorFlow
    expands palette PNGs to colours, losing the ids.

    Args:
      images_dir, masks_dir: the two folders (local or ``tf.io.gfile`` paths).
      channels: channels of the stored images, 1 or 3.
      verify: decode every image while reading (see :class:`ImageFolderSource`).
    """

    def __init__(self, images_dir, masks_dir, channels=3, verify=True):
        self.images_dir, self.masks_dir = str(images_dir), str(masks_dir)
        self.channels = _channels_arg(channels)
        self.verify = bool(verify)
        for what, d in (("images", self.images_dir), ("masks", self.masks_dir)):
            if not _isdir(d):
                raise DataError(f"{what} folder {d} does not exist or is not a folder.")
        images = self._by_stem(self.images_dir, "image")
        masks = self._by_stem(self.masks_dir, "mask")
        if not images:
            raise DataError(f"images folder {self.images_dir} holds no images "
                            f"(.png, .jpg, .jpeg).")
        no_mask = sorted(set(images) - set(masks))
        no_image = sorted(set(masks) - set(images))
        if no_mask or no_image:
            parts = []
            if no_mask:
                parts.append(f"{len(no_mask)} images have no mask in {self.masks_dir} "
                             f"(stems: {_preview(no_mask, 20)})")
            if no_image:
                parts.append(f"{len(no_image)} masks have no image in {self.images_dir} "
                             f"(stems: {_preview(no_image, 20)})")
            raise DataError("images and masks must pair up by file stem, but "
                            + "; ".join(parts) + ".")
        stems = sorted(images)
        self._images = [images[s] for s in stems]
        self._masks = [masks[s] for s in stems]
        self._num_examples = len(stems)

        image_paths = [_join(self.images_dir, n) for n in self._images]
        mask_paths = [_join(self.masks_dir, n) for n in self._masks]
        image_infos = _probe_all(image_paths)
        mask_infos = _probe_all(mask_paths)
        _check_same_size(image_paths, image_infos,
                         "Resize them beforehand; segmentation pairs are not resized.")
        height, width = image_infos[0].height, image_infos[0].width
        bad = [p for p, i in zip(mask_paths, mask_infos) if i.fmt != "png" or i.palette]
        if bad:
            raise DataError(
                f"masks must be grayscale PNGs whose pixel values are class ids; "
                f"these are JPEG or palette PNG: {_preview(bad, 5)}. Convert them "
                f"to 8-bit grayscale PNG (JPEG blurs class ids; palette colours "
                f"lose them).")
        mismatched = [f"{ip} is {ii.height}x{ii.width} but {mp} is {mi.height}x{mi.width}"
                      for ip, ii, mp, mi in zip(image_paths, image_infos, mask_paths, mask_infos)
                      if (ii.height, ii.width) != (mi.height, mi.width)]
        if mismatched:
            raise DataError(f"each mask must have its image's size; "
                            f"{_preview(mismatched, 5)}.")
        encoding, self._reencode = _choose_encoding(image_infos, self.channels)
        self._mask_reencode = np.array([not _native_ok(i, 1) for i in mask_infos], dtype=bool)
        self._mask_depth = np.array([i.depth for i in mask_infos], dtype=np.uint8)
        self.features = {
            "image": FeatureSpec("image", "uint8", (height, width, self.channels), encoding),
            "mask": FeatureSpec("mask", "uint8", (height, width, 1), "png"),
        }

    @staticmethod
    def _by_stem(directory, what):
        names, _ = _list_images(directory)
        by_stem = {}
        for name in names:
            stem = os.path.splitext(name)[0]
            if stem in by_stem:
                raise DataError(f"two {what} files in {directory} share the stem "
                                f"{stem!r} ({by_stem[stem]}, {name}), so pairing is "
                                f"ambiguous; keep one.")
            by_stem[stem] = name
        return by_stem

    def _mask_bytes(self, i, shape):
        path = _join(self.masks_dir, self._masks[i])
        if not self._mask_reencode[i]:
            return _image_bytes(path, False, 1, None, self.verify, shape)
        tf = _tf()
        with _open_rb(path) as f:
            data = f.read()
        depth = int(self._mask_depth[i])
        try:
            # 16-bit files decode as uint16 so their ids stay exact (asking
            # for uint8 would rescale them).
            mask = tf.io.decode_png(
                data, channels=0, dtype=tf.uint16 if depth == 16 else tf.uint8).numpy()
        except tf.errors.InvalidArgumentError as e:
            raise DataError(f"mask {path} is unreadable or corrupt: decoding failed "
                            f"({str(e).splitlines()[0][-200:]}). Remove or replace "
                            f"it.") from e
        if depth < 8:
            # libpng stretches 1/2/4-bit samples to 0..255 (1 -> 255 for a
            # binary mask); undo it to get the stored class ids back.
            mask = mask // (255 // (2 ** depth - 1))
        if mask.shape[-1] >= 3 and not (
                np.array_equal(mask[..., 0], mask[..., 1])
                and np.array_equal(mask[..., 0], mask[..., 2])):
            raise DataError(f"mask {path} is a colour image; masks must be grayscale "
                            f"with class ids as pixel values.")
        ids = mask[..., :1]  # drops alpha and the copies of a gray-as-RGB mask
        if ids.max(initial=0) > 255:
            raise DataError(f"mask {path} holds class id {int(ids.max())}; masks are "
                            f"stored as uint8, so ids must be at most 255.")
        return tf.io.encode_png(ids.astype(np.uint8)).numpy()

    def read(self, indices):
        """The examples at ``indices``, as {name: array}; see the module docstring."""
        idx = _as_indices(indices, len(self), self)
        images = np.empty(len(idx), dtype=object)
        masks = np.empty(len(idx), dtype=object)
        image_shape = self.features["image"].shape
        mask_shape = self.features["mask"].shape
        for k, i in enumerate(idx):
            images[k] = _image_bytes(_join(self.images_dir, self._images[i]),
                                     self._reencode[i], self.channels, None,
                                     self.verify, image_shape)
            masks[k] = self._mask_bytes(i, mask_shape)
        return {"image": images, "mask": masks}


# --------------------------------------------------------------------------
# Generated shapes.

# Mixed into every example's seed so these streams differ from other users of
# the same (seed, index) pair.
_SHAPES_SALT = 0x5EA5_0001


class ShapesSource(_Source):
    """A generated segmentation set: 1-3 coloured shapes on a noisy background.

    Each example depends only on (seed, index), so any read order or batching
    gives the same example for the same index. Features: ``image`` uint8
    (S, S, 3) and ``mask`` uint8 (S, S, 1), both ``raw``; mask values index
    :data:`SHAPES_CLASSES` (0 background, 1 circle, 2 rectangle, 3 triangle;
    later shapes overwrite earlier ones).

    Args:
      num_examples: how many examples the source holds.
      image_size: S, at least 16.
      seed: non-negative int selecting the set.

    Example::

        source = ShapesSource(1000, image_size=64, seed=0)
        image, mask = source.example(7)
    """

    _TRANSIENT = ("_grid",)

    def __init__(self, num_examples, image_size=64, seed=0):
        for name, value, low in (("num_examples", num_examples, 0),
                                 ("image_size", image_size, 16), ("seed", seed, 0)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low:
                raise UsageError(f"ShapesSource: {name} must be an int >= {low}; "
                                 f"got {value!r}.")
        self._num_examples = int(num_examples)
        self.image_size = int(image_size)
        self.seed = int(seed)
        s = self.image_size
        self.features = {
            "image": FeatureSpec("image", "uint8", (s, s, 3), "raw"),
            "mask": FeatureSpec("mask", "uint8", (s, s, 1), "raw"),
        }

    @functools.cached_property
    def _grid(self):
        # Pixel centres, so shapes are symmetric about their centre.
        coords = np.arange(self.image_size, dtype=np.float32) + 0.5
        yy, xx = np.meshgrid(coords, coords, indexing="ij")
        return yy, xx

    def example(self, index):
        """(image, mask) of example ``index``: uint8 (S, S, 3) and (S, S, 1)."""
        index = int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"ShapesSource: index {index} is out of range; the source "
                             f"holds {len(self)} examples.")
        s = float(self.image_size)
        yy, xx = self._grid
        rng = np.random.default_rng([_SHAPES_SALT, self.seed, index])
        background = rng.integers(0, 256, 3)
        canvas = np.empty((self.image_size, self.image_size, 3), dtype=np.int16)
        canvas[...] = background
        mask = np.zeros((self.image_size, self.image_size), dtype=np.uint8)
        for _ in range(int(rng.integers(1, 4))):
            kind = int(rng.integers(1, 4))
            colour = rng.integers(0, 256, 3)
            for _ in range(8):
                # Keep shapes visible against the background.
                if np.abs(colour - background).sum() >= 160:
                    break
                colour = rng.integers(0, 256, 3)
            if kind == 1:
                r = rng.uniform(0.08 * s, 0.22 * s)
                cy, cx = rng.uniform(r, s - r, 2)
                inside = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
            elif kind == 2:
                hh, hw = rng.uniform(0.07 * s, 0.22 * s, 2)
                cy = rng.uniform(hh, s - hh)
                cx = rng.uniform(hw, s - hw)
                inside = (np.abs(yy - cy) <= hh) & (np.abs(xx - cx) <= hw)
            else:
                r = rng.uniform(0.12 * s, 0.28 * s)
                cy, cx = rng.uniform(r, s - r, 2)
                angles = (rng.uniform(0, 2 * np.pi) + np.arange(3) * (2 * np.pi / 3)
                          + rng.uniform(-0.3, 0.3, 3))
                vy, vx = cy + r * np.sin(angles), cx + r * np.cos(angles)
                # Half-plane tests: inside when on the same side of all edges.
                # Multiplying by the orientation makes "same side" mean >= 0.
                orient = np.sign((vx[1] - vx[0]) * (vy[2] - vy[0])
                                 - (vy[1] - vy[0]) * (vx[2] - vx[0])) or 1.0
                inside = np.ones_like(mask, dtype=bool)
                for a, b in ((0, 1), (1, 2), (2, 0)):
                    edge = ((vx[b] - vx[a]) * (yy - vy[a]) - (vy[b] - vy[a]) * (xx - vx[a]))
                    inside &= edge * orient >= 0
            canvas[inside] = colour
            mask[inside] = kind
        canvas += rng.integers(-20, 21, canvas.shape, dtype=np.int16)
        image = np.clip(canvas, 0, 255).astype(np.uint8)
        return image, mask[..., None]

    def read(self, indices):
        """The examples at ``indices``, as {name: array}; see the module docstring."""
        idx = _as_indices(indices, len(self), self)
        s = self.image_size
        images = np.empty((len(idx), s, s, 3), dtype=np.uint8)
        masks = np.empty((len(idx), s, s, 1), dtype=np.uint8)
        for k, i in enumerate(idx):
            images[k], masks[k] = self.example(i)
        return {"image": images, "mask": masks}


__all__ = [
    "ArraySource", "IdxSource", "ImageFolderSource", "SegmentationFolderSource",
    "ShapesSource", "read_idx", "write_idx", "find_idx_files", "download_idx",
    "DEBIAN_FASHION_MNIST_DIR", "SHAPES_CLASSES", "IDX_IMAGES_MAGIC", "IDX_LABELS_MAGIC",
]
