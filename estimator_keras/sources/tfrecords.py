"""TFRecord files written by other tools, imported into this package's layout.

:func:`tfrecord_splits` reads a glob of ``tf.train.Example`` files (the seed
question's ``height``/``width``/``depth``/``label``/``image_raw`` layout,
ImageNet-style ``image/encoded`` + ``image/class/label`` records, TFDS shards
with ``image`` + ``label``, or any keys named with ``features``), checks
every record once, and returns train and test :class:`TFRecordImportSource`
whose images are decoded, converted and resized to one shape.

Records are found again by their byte offset, so the writer can read them in
any order; ``.gz`` files are first decompressed once into ``cache_dir``. They
are read and parsed without TensorFlow (:func:`estimator_keras.record_files.read_records`,
:mod:`estimator_keras.example_codec`); images that must be decoded, resized
or re-encoded need it (see :mod:`estimator_keras.sources.images`).
Feature names in the dataset must be plain names: a record key such as
``image/encoded`` becomes feature ``image`` (or what ``features`` says), and
the label is always feature ``label``.

Example::

    found = tfrecord_splits("old/train-*.tfrecord", image_size=(64, 64))
    write_dataset(found.splits, "data/old")
"""

import dataclasses
import gzip
import hashlib
import os
import re
import shutil
import struct
import tempfile

import numpy as np
from google.protobuf.message import DecodeError

from estimator_keras import example_codec, io, record_files
from estimator_keras.errors import CorruptRecordError, DataError, UsageError
from estimator_keras.manifest import MANIFEST_NAME, compression_of
from estimator_keras.schema import FeatureSpec
from estimator_keras.sources.base import Source, as_indices, preview
from estimator_keras.sources.images import (
    STORED_AS_THEY_ARE, BadImage, ImageInfo, channels_arg, decode_pixels,
    encode_png, image_size_arg, inspect_image, looks_like_image, pixels_need_tensorflow,
    plan_storage, resize_pixels, to_channels)
from estimator_keras.tf_optional import require as require_tensorflow
from estimator_keras.sources.layouts import check_fraction
from estimator_keras.sources.scan import (
    Imported, Progress, Skipped, channels_note, hash_split, majority_channels, most_common_size,
    parallel_map, refuse_skipped, size_note)

IMAGE_KEYS = ("image/encoded", "image", "image_bytes", "encoded", "img")
"""Record keys tried, in order, for the image when ``features`` is not given."""
LABEL_KEYS = ("label", "image/class/label", "class", "label_id", "labels")
"""Record keys tried, in order, for the label when ``label`` is not given."""
SEED_DIMS = ("height", "width", "depth")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SKIPS_KEPT = 200  # per file; the rest are counted


class _BadRecord(Exception):
    """A record left out; the message says why."""


def _features(record):
    """A serialized tf.train.Example's feature map (DecodeError when it is not one)."""
    return example_codec.message_class("Example").FromString(record).features.feature


@dataclasses.dataclass(frozen=True)
class Column:
    """One feature of the dataset and where it sits in the records.

    ``kind`` is "encoded" (an encoded image), "raw_image" (uint8 bytes shaped
    by the record's int64 height, width and depth), "int64", "float" or
    "bytes"; ``shape`` is the value's shape for int64 and float.
    """

    name: str
    key: str
    kind: str
    shape: tuple = ()


def _feature(features, key):
    if key not in features:
        raise _BadRecord(f"it has no feature {key!r}")
    return features[key]


def _single(values, key, what):
    if len(values) != 1:
        raise _BadRecord(f"{key!r} holds {len(values)} {what} values, not one")
    return values[0]


def _raw_shape(features, key):
    dims = []
    for dim in SEED_DIMS:
        values = _feature(features, dim).int64_list.value
        dims.append(int(_single(values, dim, "int64")))
    if dims[2] not in (1, 2, 3, 4) or min(dims) < 1:
        raise _BadRecord(f"{key!r} has shape {tuple(dims)}; expected (height, width, "
                         f"1 to 4 channels)")
    return tuple(dims)


def column_value(features, column):
    """The value of ``column`` in a record's features: bytes for images and
    bytes features, a (bytes, shape) pair for raw images, else an array."""
    feature = _feature(features, column.key)
    if column.kind in ("encoded", "bytes", "raw_image"):
        data = _single(feature.bytes_list.value, column.key, "bytes")
        if column.kind != "raw_image":
            return data
        shape = _raw_shape(features, column.key)
        if len(data) != int(np.prod(shape)):
            raise _BadRecord(f"{column.key!r} holds {len(data)} bytes, but height x width "
                             f"x depth is {shape} = {int(np.prod(shape))}")
        return data, shape
    values = (feature.int64_list.value if column.kind == "int64"
              else feature.float_list.value)
    size = int(np.prod(column.shape))
    if len(values) != size:
        raise _BadRecord(f"{column.key!r} holds {len(values)} {column.kind} values; the "
                         f"first record holds {size}")
    return np.asarray(values, dtype=np.int64 if column.kind == "int64" else np.float32
                      ).reshape(column.shape)


def _label_value(features, key):
    feature = _feature(features, key)
    if feature.WhichOneof("kind") != "int64_list":
        raise _BadRecord(f"its label {key!r} is not an int64 value")
    label = int(_single(feature.int64_list.value, key, "int64"))
    if label < 0:
        raise _BadRecord(f"its label {label} is negative; labels must be class ids 0, 1, ...")
    return label


def _kind_of(features, key):
    """The Column kind a record key's value calls for."""
    feature = features[key]
    kind = feature.WhichOneof("kind")
    if kind == "bytes_list" and len(feature.bytes_list.value) == 1:
        data = feature.bytes_list.value[0]
        if looks_like_image(data):
            return "encoded", ()
        try:
            if len(data) == int(np.prod(_raw_shape(features, key))):
                return "raw_image", ()
        except _BadRecord:
            pass
        return "bytes", ()
    if kind in ("int64_list", "float_list"):
        n = len(getattr(feature, kind).value)
        return kind.split("_")[0], (() if n == 1 else (n,))
    raise DataError(f"record key {key!r} holds {kind or 'nothing'} with "
                    f"{len(getattr(feature, kind).value) if kind else 0} values; "
                    f"only one bytes value, or int64 / float lists, can be imported.")


def detect_columns(features, mapping=None, label=None):
    """(columns, label key) for records whose first one has ``features``.

    Args:
      mapping: dict feature name -> record key, or None to find the image
        (the seed question's ``image_raw``, or a key of :data:`IMAGE_KEYS`,
        or the one bytes value that is an encoded image) as feature ``image``.
      label: the label's record key, or None to try :data:`LABEL_KEYS`.
    """
    keys = sorted(features)
    if mapping is None:
        if set(SEED_DIMS) | {"image_raw"} <= set(keys):
            mapping = {"image": "image_raw"}
        else:
            found = [k for k in IMAGE_KEYS if k in features] + [
                k for k in keys if features[k].bytes_list.value
                and looks_like_image(features[k].bytes_list.value[0])]
            if not found:
                raise DataError(f"the records hold no image this importer recognises; "
                                f"their keys are {preview(keys, 30)}. Name the inputs "
                                f"with --features NAME=KEY,...")
            mapping = {"image": found[0]}
    columns = []
    for name, key in mapping.items():
        if not _NAME_RE.match(name) or name == "label":
            raise UsageError(f"feature name {name!r} (for record key {key!r}) must be "
                             f"letters, digits and '_', not starting with a digit, and "
                             f"not 'label' (the label's name).")
        if key not in features:
            raise DataError(f"the records have no key {key!r} (named for feature "
                            f"{name!r}); their keys are {preview(keys, 30)}.")
        columns.append(Column(name, key, *_kind_of(features, key)))
    if label is None:
        label = next((k for k in LABEL_KEYS if k in features
                      and features[k].WhichOneof("kind") == "int64_list"), None)
        missing = None if label else (f"the records have no label key this importer "
                                      f"recognises ({', '.join(LABEL_KEYS)})")
    else:
        missing = None if label in features else f"--label {label!r} is not a key of the records"
    if missing:
        raise DataError(f"{missing}; their keys are {preview(keys, 30)}. Name the label "
                        f"with --label KEY.")
    return columns, label


def first_features(path, compression):
    """The features of the first readable record of ``path``."""
    found = record_files.read_records(path, compression)
    try:
        for record in found:
            return _features(record)
    except (CorruptRecordError, OSError) as e:
        raise DataError(f"cannot read the first record of {path}: "
                        f"{getattr(e, 'reason', e)}") from e
    except DecodeError as e:
        raise DataError(f"the first record of {path} is not a tf.train.Example "
                        f"({type(e).__name__}).") from e
    finally:
        found.close()
    raise DataError(f"{path} holds no records.")


def local_copy(path, cache_dir):
    """``path`` itself when it can be read at random offsets, else (``.gz``)
    its decompressed copy in ``cache_dir``, keyed by path, size and mtime."""
    if compression_of(path) != "GZIP":
        return path
    key = hashlib.sha256(f"{path}|{io.size(path)}|{io.mtime_ns(path)}".encode()).hexdigest()
    cached = io.join(cache_dir, f"{io.basename(path)[:-3]}.{key[:16]}")
    if not io.exists(cached):
        io.makedirs(cache_dir)
        try:
            with io.open_file(path, "rb") as raw, gzip.GzipFile(fileobj=raw) as src, \
                    io.atomic_file(cached, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
        except (OSError, EOFError) as e:
            raise DataError(f"{path} is named .gz but cannot be decompressed ({e}); "
                            f"copy it again, or drop the .gz suffix if it is plain.") from e
    return cached


@dataclasses.dataclass
class _FileScan:
    """What one file holds: each kept record's start, length, label and
    image info codes, plus what was left out."""

    starts: np.ndarray
    lengths: np.ndarray
    labels: np.ndarray
    codes: dict            # column name -> int32 array into tables[name]
    tables: dict           # column name -> list of ImageInfo
    texts: dict            # label -> class text seen beside it
    skipped: list
    num_skipped: int


def _scan_file(job):
    """Reads every record of one file (in a worker process) and checks it."""
    name, local, columns, label_key, text_key = job
    starts, lengths, labels, skipped = [], [], [], []
    tables = {c.name: {} for c in columns if c.kind in ("encoded", "raw_image")}
    codes = {c: [] for c in tables}
    texts, num_skipped, offset = {}, 0, 0

    def skip(what, reason):
        nonlocal num_skipped
        num_skipped += 1
        if len(skipped) < _SKIPS_KEPT:
            skipped.append(Skipped(f"{name} {what}", reason))

    try:
        for index, record in enumerate(record_files.read_records(local)):
            start, offset = offset, offset + len(record) + 16
            try:
                features = _features(record)
                label = _label_value(features, label_key)
                infos = {c.name: _image_info(features, c) for c in columns
                         if c.name in tables}
                for c in columns:
                    if c.name not in tables:
                        column_value(features, c)
            except _BadRecord as e:
                skip(f"record {index}", str(e))
                continue
            except DecodeError as e:
                skip(f"record {index}", f"not a tf.train.Example ({type(e).__name__})")
                continue
            starts.append(start)
            lengths.append(len(record))
            labels.append(label)
            for c, info in infos.items():
                codes[c].append(tables[c].setdefault(info, len(tables[c])))
            if text_key and label not in texts and text_key in features:
                values = features[text_key].bytes_list.value
                texts[label] = values[0].decode("utf-8", "replace") if values else ""
    except CorruptRecordError as e:
        skip(f"from record {e.record} (byte {e.offset}) on", f"unreadable: {e.reason[-200:]}")
    return _FileScan(np.asarray(starts, np.int64), np.asarray(lengths, np.int64),
                     np.asarray(labels, np.int64),
                     {c: np.asarray(v, np.int32) for c, v in codes.items()},
                     {c: list(t) for c, t in tables.items()}, texts, skipped, num_skipped)


def _image_info(features, column):
    value = column_value(features, column)
    if column.kind == "raw_image":
        (_, (height, width, depth)) = value
        return ImageInfo("raw", height, width, depth, grey=depth <= 2)
    try:
        return inspect_image(value)
    except BadImage as e:
        raise _BadRecord(f"its image {column.key!r} is unreadable: {e}") from e


class TFRecordImportSource(Source):
    """Examples of other tools' TFRecord files, found by byte offset.

    Built by :func:`tfrecord_splits`, which checks every record first.
    Images become uint8 (height, width, channels) features stored as the
    records hold them when they all fit (PNG or JPEG of one size), else
    as raw pixels.

    Args:
      files: the (local, uncompressed) files to read.
      file_ids, starts, lengths, label_ids: one entry per example.
      columns: the :class:`Column` list; ``codes`` maps an image column's
        name to each example's index into its ``reencode`` flags.
      specs: the FeatureSpec of each column; ``labels``: the manifest's
        label record.
    """

    def __init__(self, files, file_ids, starts, lengths, label_ids, *, columns, specs,
                 codes, reencode, labels):
        self.files = list(files)
        self._file_ids = np.asarray(file_ids, np.int32)
        self._starts = np.asarray(starts, np.int64)
        self._lengths = np.asarray(lengths, np.int64)
        self._label_ids = np.asarray(label_ids, np.int64)
        self.columns = list(columns)
        self._codes = codes
        self._reencode = reencode
        self.labels = labels
        self.features = dict(specs)
        self.features["label"] = FeatureSpec("label", "int64", (), "int64")
        self._num_examples = len(self._starts)

    def _records(self, idx):
        """The serialized records at ``idx``, read file by file in offset order."""
        out = [None] * len(idx)
        order = np.lexsort((self._starts[idx], self._file_ids[idx]))
        current, f = None, None
        try:
            for k in order:
                i = idx[k]
                if self._file_ids[i] != current:
                    if f is not None:
                        f.close()
                    current = self._file_ids[i]
                    f = io.open_file(self.files[current], "rb")
                f.seek(int(self._starts[i]))
                length = struct.unpack("<Q", f.read(12)[:8])[0]
                if length != self._lengths[i]:
                    raise DataError(f"{self.files[current]} changed since it was checked: "
                                    f"the record at byte {self._starts[i]} is {length} "
                                    f"bytes, not {self._lengths[i]}. Run prepare again.")
                out[k] = f.read(length)
        finally:
            if f is not None:
                f.close()
        return out

    def _convert(self, column, value, code):
        spec = self.features[column.name]
        if column.kind == "raw_image":
            data, shape = value
            pixels = np.frombuffer(data, np.uint8).reshape(shape)
            return resize_pixels(to_channels(pixels, spec.shape[2]), spec.shape[:2])
        if column.kind != "encoded":
            return value
        if spec.encoding == "raw":
            return decode_pixels(value, spec.shape[2], spec.shape[:2], f"image {column.key}")
        if self._reencode[column.name][code]:
            return encode_png(decode_pixels(value, spec.shape[2]), f"an image of {column.key!r}")
        return value

    def read(self, indices):
        """The examples at ``indices``, as {name: array}; see :mod:`base`."""
        idx = as_indices(indices, len(self), self)
        out = {}
        for name, spec in self.features.items():
            if spec.encoding in ("png", "jpeg", "bytes"):
                out[name] = np.empty(len(idx), dtype=object)
            else:
                out[name] = np.empty((len(idx),) + spec.shape, dtype=spec.dtype)
        for k, record in enumerate(self._records(idx)):
            features = _features(record)
            for column in self.columns:
                code = self._codes[column.name][idx[k]] if column.name in self._codes else 0
                out[column.name][k] = self._convert(
                    column, column_value(features, column), code)
        out["label"] = self._label_ids[idx]
        return out


def _parse_names(class_names, num_classes, seen_max, texts, names_file):
    """(num_classes, class names or None) from the flags and what was seen."""
    names = list(class_names) if class_names else None
    listed = None
    if names is None and names_file and io.exists(names_file):
        listed = [n.strip() for n in io.read_text(names_file).splitlines() if n.strip()]
    if num_classes:
        n = int(num_classes)
    elif names:
        n = len(names)
    elif listed and len(listed) > seen_max:
        n = len(listed)
    else:
        n = seen_max + 1
    if seen_max >= n:
        raise DataError(f"the records hold label {seen_max}, but there are only {n} "
                        f"classes (labels 0..{n - 1}); raise --num-classes or give "
                        f"more --class-names.")
    if names is None and listed and len(listed) == n:
        names = listed
    if names is None and texts and all(i in texts for i in range(n)):
        names = [texts[i] for i in range(n)]
    return n, names


def _check_class_flags(class_names, num_classes):
    if num_classes is not None and int(num_classes) < 1:
        raise UsageError(f"--num-classes must be a positive integer; given {num_classes}.")
    if class_names and num_classes and len(class_names) != int(num_classes):
        raise UsageError(f"--class-names gives {len(class_names)} names but --num-classes "
                         f"is {num_classes}.")


def _record_files(pattern, what):
    files = [f for f in io.glob(pattern) if not io.isdir(f) and io.basename(f) != MANIFEST_NAME]
    if not files:
        raise DataError(f"{what} {pattern!r} matches no files.")
    return files


def _scan_glob(files, pattern, columns, label, cache_dir, num_workers, progress, mapper):
    text_key = label[:-len("label")] + "text" if label.endswith("/label") else None
    locals_ = [local_copy(f, cache_dir) for f in files]
    bar = Progress(f"checking the records of {len(files)} file{'s' * (len(files) > 1)} "
                   f"({pattern})", len(files), "files", progress)
    jobs = [(io.basename(f), l, columns, label, text_key) for f, l in zip(files, locals_)]
    scans = (mapper or parallel_map)(_scan_file, jobs, num_workers, lambda _: bar.add(1))
    return files, locals_, scans


def tfrecord_splits(pattern, *, features=None, label=None, image_size=None, channels=None,
                    test_fraction=0.1, test_pattern=None, num_classes=None, class_names=None,
                    strict=False, num_workers=1, progress=True, cache_dir=None, mapper=None):
    """Train and test :class:`TFRecordImportSource` of other tools' records.

    Args:
      pattern: glob of the TFRecord files (``.gz`` ones are decompressed).
      features: dict feature name -> record key, or None for the image alone
        (see :func:`detect_columns`).
      label: the label's record key, or None to find it.
      image_size: (height, width) for every image; default the most common.
      channels: 1 or 3; default what most images are.
      test_fraction: share of each class held out, by a hash of each
        record's file name and index; not used with ``test_pattern``.
      test_pattern: glob of the test split's files.
      num_classes: default the largest label seen + 1.
      class_names: default a TFDS ``<label>.labels.txt`` beside the files, or
        the ``.../class/text`` values beside ``.../class/label``, when they
        name every class.
      strict: refuse unreadable records instead of skipping them.
      cache_dir: where ``.gz`` files are decompressed.
      mapper: reads the files instead of worker processes (see
        :func:`~estimator_keras.sources.scan.check_images`).
    """
    image_size = image_size_arg(image_size)
    chosen_channels = None if channels is None else channels_arg(channels)
    fraction = None if test_pattern else check_fraction(test_fraction)
    _check_class_flags(class_names, num_classes)
    cache_dir = cache_dir or os.path.join(tempfile.gettempdir(), "estimator_keras_tfrecords")
    globs = {"train": _record_files(pattern, "--source")}
    if test_pattern:
        globs["test"] = _record_files(test_pattern, "--test-source")
    first = globs["train"][0]
    columns, label = detect_columns(first_features(first, compression_of(first)),
                                    features, label)
    found = {s: _scan_glob(files, test_pattern if s == "test" else pattern, columns, label,
                           cache_dir, num_workers, progress, mapper)
             for s, files in globs.items()}
    every = [scan for _, _, scans in found.values() for scan in scans]
    skipped = [entry for scan in every for entry in scan.skipped]
    num_skipped = sum(scan.num_skipped for scan in every)
    if strict:
        refuse_skipped(skipped, "records")
    if not sum(len(s.starts) for s in every):
        raise DataError(f"{pattern!r} holds no readable records: "
                        f"{preview(map(str, skipped), 5)}.")
    seen_max = max(int(s.labels.max()) for s in every if len(s.labels))
    texts = {}
    for scan in every:
        for k, v in scan.texts.items():
            texts.setdefault(k, v)
    n, names = _parse_names(class_names, num_classes, seen_max, texts,
                            io.join(io.parent(first), f"{label}.labels.txt"))
    labels = {"label": {"num_classes": n, "class_names": names}}

    specs, split_codes, reencode, notes = {}, {}, {}, []
    for column in columns:
        if column.kind not in ("encoded", "raw_image"):
            specs[column.name] = (
                FeatureSpec(column.name, "string", (), "bytes") if column.kind == "bytes"
                else FeatureSpec(column.name, "int64" if column.kind == "int64" else "float32",
                                 column.shape, column.kind))
            continue
        table, codes = _merge_tables(every, column.name)
        counts = np.bincount(np.concatenate(codes), minlength=len(table))
        sizes = np.repeat(np.array([i.size for i in table], np.int64).reshape(-1, 2),
                          counts, axis=0).tolist()
        size = image_size or most_common_size(sizes)
        greys = np.repeat([i.grey for i in table], counts)
        ch = chosen_channels or majority_channels(greys)
        encoding, flags = plan_storage(table, ch, size)
        if column.kind == "raw_image":
            encoding = "raw"
            if pixels_need_tensorflow(table, ch, size):
                require_tensorflow(f"converting the raw images of {column.key!r} to "
                                   f"{size[0]}x{size[1]}x{ch}", STORED_AS_THEY_ARE)
        elif encoding == "raw" or flags.any():
            require_tensorflow(f"storing the images of {column.key!r} as "
                               f"{'raw pixels' if encoding == 'raw' else 'PNG re-encodings'}",
                               STORED_AS_THEY_ARE)
        specs[column.name] = FeatureSpec(column.name, "uint8", size + (ch,), encoding)
        reencode[column.name] = flags
        start = 0
        for split, (_, _, scans) in found.items():
            split_codes.setdefault(split, {})[column.name] = np.concatenate(
                codes[start:start + len(scans)])
            start += len(scans)
        notes += [size_note(column.name, size, image_size is not None, sizes),
                  channels_note(column.name, ch, chosen_channels, int(greys.sum()), len(greys))
                  + f", stored as {encoding} (from {column.key!r})"]
    notes.append(f"label from {label!r}: {n} classes"
                 + (f" ({preview(names, 20)})" if names else
                    f"; the {len(texts)} class texts beside it do not name all {n} (pass "
                    f"--class-names)" if texts else ""))
    if num_skipped > len(skipped):
        notes.append(f"{num_skipped} records skipped in all ({len(skipped)} listed)")

    def source(split, keep=None):
        _, locals_, scans = found[split]
        ids = np.concatenate([np.full(len(s.starts), i, np.int32) for i, s in enumerate(scans)])
        cat = {k: np.concatenate([getattr(s, k) for s in scans])
               for k in ("starts", "lengths", "labels")}
        rows = np.arange(len(ids)) if keep is None else np.flatnonzero(keep)
        return TFRecordImportSource(
            locals_, ids[rows], cat["starts"][rows], cat["lengths"][rows],
            cat["labels"][rows], columns=columns, specs=specs,
            codes={c: v[rows] for c, v in split_codes.get(split, {}).items()},
            reencode=reencode, labels=labels)

    if test_pattern:
        splits = {s: source(s) for s in found}
    else:
        files, _, scans = found["train"]
        keys = [f"{io.basename(f)}:{start}" for f, s in zip(files, scans) for start in s.starts]
        test = hash_split(keys, np.concatenate([s.labels for s in scans]), fraction)
        splits = {"train": source("train", ~test), "test": source("train", test)}
    if not len(splits["test"]):
        raise DataError(f"the test split of {pattern!r} is empty; raise --test-fraction "
                        f"or give --test-source.")
    return Imported(splits, skipped, notes, pattern, "records")


def _merge_tables(scans, name):
    """One table of ImageInfo for all files, and each file's codes into it."""
    index, codes = {}, []
    for scan in scans:
        remap = np.array([index.setdefault(info, len(index)) for info in scan.tables[name]]
                         or [0], dtype=np.int32)
        codes.append(remap[scan.codes[name]] if len(scan.codes[name]) else scan.codes[name])
    table = sorted(index, key=index.get)
    return table, codes
