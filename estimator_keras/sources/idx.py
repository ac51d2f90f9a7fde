"""MNIST-format (IDX) files: the codec, a decompression cache, IdxSource.

:func:`read_idx` / :func:`write_idx` read and write whole IDX files (``.gz``
or not). :class:`IdxSource` memory-maps an images file and a labels file; a
``.gz`` or remote file is first streamed once, uncompressed, into a cache
(by default this user's private :func:`user_cache_dir`, verified by SHA-256
on every reuse) so that reads stay random-access and memory stays flat.
:func:`find_idx_files` locates a split's pair of files in a folder.

Example::

    images, labels = find_idx_files(DEBIAN_FASHION_MNIST_DIR, "train")
    source = IdxSource(images, labels)
    batch = source.read(np.array([5, 0, 5]))
    batch["image"].shape   # (3, 28, 28, 1), uint8
"""

import functools
import gzip
import hashlib
import json
import logging
import os
import stat
import struct
import zlib

import numpy as np

from estimator_keras import io
from estimator_keras.errors import DataError, UsageError
from estimator_keras.schema import FeatureSpec
from estimator_keras.sources.base import Source, as_indices

logger = logging.getLogger(__name__)

DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
"""Where the Debian package ``dataset-fashion-mnist`` installs the IDX files."""

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

_COPY_CHUNK = 1 << 20


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
    raw = io.open_file(path, "rb")
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
    io.atomic_write(str(path), data)


CACHE_NAME = "estimator-keras"


def user_cache_dir(*parts):
    """This user's private cache folder, ``$XDG_CACHE_HOME/estimator-keras/PARTS``
    (``~/.cache/estimator-keras/PARTS`` by default), created owner-only (0700).

    Never the shared temp dir: another user could plant files there under the
    predictable names a cache uses.

    Raises:
      DataError: the folder (or one above it, from ``estimator-keras`` down)
        exists but belongs to another user, is writable by group or others,
        or is not a folder.
    """
    base = os.environ.get("XDG_CACHE_HOME", "")
    # The XDG spec ignores a relative path here.
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create the cache folder {base}: {e.strerror}; set "
                        f"XDG_CACHE_HOME to a folder of yours.") from e
    path = base
    for name in (CACHE_NAME,) + tuple(str(p) for p in parts):
        path = os.path.join(path, name)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise DataError(f"cannot create the cache folder {path}: {e.strerror}.") from e
        _check_private(path)
    return path


def _check_private(path):
    info = os.stat(path)
    problem = None
    if not stat.S_ISDIR(info.st_mode):
        problem = "is not a folder"
    elif info.st_uid != os.getuid():
        problem = f"belongs to uid {info.st_uid}, not to you (uid {os.getuid()})"
    elif info.st_mode & 0o022:
        who = " and ".join(w for bit, w in ((0o020, "group"), (0o002, "others"))
                           if info.st_mode & bit)
        problem = f"is writable by {who} (mode {stat.S_IMODE(info.st_mode):04o})"
    if problem:
        raise DataError(
            f"the cache folder {path} {problem}: files cached there could be replaced by "
            f"someone else, so it is not used. Remove it, or `chmod 700` a folder of yours, "
            f"or point XDG_CACHE_HOME at a private folder.")


def sha256_of(path):
    """The SHA-256 of a file (local or remote), hex."""
    digest = hashlib.sha256()
    with io.open_file(str(path), "rb") as f:
        for chunk in iter(lambda: f.read(_COPY_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


# A cached IDX file ends with a trailer after its data: a JSON record of the
# SHA-256 of its source and of its own IDX bytes, the record's length (8 bytes,
# big-endian) and this mark. Memory maps stop at the data and never see it.
_TRAILER_MARK = b"EKIDXSHA"


def _cache_trailer(data_sha256, source_sha256, source):
    record = json.dumps({"source": source, "source_sha256": source_sha256,
                         "sha256": data_sha256}).encode()
    return record + struct.pack(">Q", len(record)) + _TRAILER_MARK


def _cached_is_valid(cached, magic, source_sha256):
    """The header of ``cached`` when its trailer records ``source_sha256`` and
    the SHA-256 of its IDX bytes matches the one recorded, else None."""
    try:
        size = io.size(cached)
        with io.open_file(cached, "rb") as f:
            header = _parse_idx_header(f, cached, magic)
            f.seek(header.total_bytes)
            trailer = f.read()
            if len(trailer) < 16 or trailer[-8:] != _TRAILER_MARK:
                return None
            (length,) = struct.unpack(">Q", trailer[-16:-8])
            if header.total_bytes + length + 16 != size:
                return None
            record = json.loads(trailer[:length])
            f.seek(0)
            digest = hashlib.sha256()
            remaining = header.total_bytes
            while remaining:
                chunk = f.read(min(_COPY_CHUNK, remaining))
                if not chunk:
                    return None
                digest.update(chunk)
                remaining -= len(chunk)
    except (OSError, ValueError, DataError, struct.error):
        return None
    if (not isinstance(record, dict) or record.get("source_sha256") != source_sha256
            or record.get("sha256") != digest.hexdigest()):
        return None
    return header


def _idx_local_file(path, magic, cache_dir):
    """Validates an IDX file and returns (local uncompressed path, header).

    A local uncompressed file is used in place. A ``.gz`` or remote file is
    streamed once into ``cache_dir`` (default :func:`user_cache_dir`
    ``("idx")``) under a name keyed by its path, size and mtime, with the
    SHA-256 of the source and of the cached IDX bytes recorded in a trailer
    after the data; a cached file is reused only when both hashes still
    match, so later calls (and worker processes) skip the decompression and
    memory stays flat.
    """
    path = str(path)
    if not io.exists(path):
        raise DataError(f"IDX file {path} does not exist.")
    remote = io.is_remote(path)
    if not remote and not path.endswith(".gz"):
        with io.open_file(path, "rb") as f:
            header = _parse_idx_header(f, path, magic)
        size = io.size(path)
        if size != header.total_bytes:
            what = "is truncated" if size < header.total_bytes else "is longer than its header says"
            raise DataError(
                f"IDX file {path} {what}: its header ({header.describe()}) "
                f"implies {header.total_bytes} bytes in all, but the file has "
                f"{size}.")
        return path, header

    cache_dir = str(cache_dir) if cache_dir else user_cache_dir("idx")
    io.makedirs(cache_dir)
    key = hashlib.sha256(f"{path if remote else os.path.abspath(path)}"
                         f"|{io.size(path)}|{io.mtime_ns(path)}".encode()).hexdigest()[:16]
    base = io.basename(path)
    base = base[:-3] if base.endswith(".gz") else base
    cached = io.join(cache_dir, f"{base}.{key}")
    source_sha256 = sha256_of(path)
    if io.exists(cached):
        header = _cached_is_valid(cached, magic, source_sha256)
        if header is not None:
            return cached, header
        logger.warning("IDX cache file %s does not match the hashes recorded in it; "
                       "decompressing %s again", cached, path)

    def stream():
        digest = hashlib.sha256()
        with _open_idx(path) as f:
            header = _parse_idx_header(f, path, magic)
            # Concurrent writers produce identical bytes, so the last rename
            # winning is harmless.
            with io.atomic_file(cached, "wb") as out:
                head = (header.magic.to_bytes(4, "big")
                        + struct.pack(f">{len(header.shape)}I", *header.shape))
                out.write(head)
                digest.update(head)
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
                    digest.update(chunk)
                    remaining -= len(chunk)
                if f.read(1):
                    raise DataError(
                        f"IDX file {path} does not match its header: the header "
                        f"({header.describe()}) announces {header.data_bytes} "
                        f"bytes of data but more follow.")
                out.write(_cache_trailer(digest.hexdigest(), source_sha256, path))
        return header

    header = _wrap_stream_errors(path, stream)
    logger.debug("IDX %s cached uncompressed at %s", path, cached)
    return cached, header


class IdxSource(Source):
    """MNIST-format (IDX) images and labels, memory-mapped.

    Features: ``image_feature`` uint8 of shape (rows, cols, 1) encoded
    ``raw`` (28x28x1 for MNIST and Fashion-MNIST) and ``label_feature`` an
    int64 scalar encoded ``int64``.

    Args:
      images_path, labels_path: IDX files (magic 0x00000803 and 0x00000801),
        ``.gz`` or not, local or any ``tf.io.gfile`` path.
      image_feature, label_feature: feature names.
      cache_dir: where ``.gz`` and remote files are decompressed once (default:
        ``user_cache_dir("idx")``, private to this user); uncompressed local
        files are memory-mapped in place.

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
        if not io.exists(local):
            # A cache file may be cleaned between pickling and use.
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
        idx = as_indices(indices, len(self), self)
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
    if not io.isdir(source_dir):
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
        hit = next((n for n in names if io.exists(io.join(source_dir, n))), None)
        if hit is None:
            missing.append(f"{kind} (looked for {', '.join(names)})")
        else:
            found.append(io.join(source_dir, hit))
    if missing:
        raise DataError(
            f"the {split} split's IDX files are missing from {source_dir}: "
            f"{'; '.join(missing)}.")
    return found[0], found[1]
