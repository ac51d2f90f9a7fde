"""Example sources: readers of source formats that the dataset writer consumes.

Every source follows one protocol (``features``, ``len``, ``read(indices)``),
described in :mod:`estimator_keras.sources.base`. Modules:

- ``base``: the protocol's shared plumbing and :class:`ArraySource` (numpy arrays);
- ``idx``: MNIST / Fashion-MNIST IDX files: :func:`read_idx`, :func:`write_idx`,
  :class:`IdxSource`, :func:`find_idx_files`;
- ``download``: :func:`download_idx`, fetching MNIST / Fashion-MNIST as IDX files;
- ``images``: PNG / JPEG / GIF / BMP header probing, decoding, and what is
  stored per image;
- ``folders``: :class:`ImageFolderSource` (a sub-folder per class),
  :class:`SegmentationFolderSource` (image / mask pairs matched by file stem),
  and the :class:`ImageListSource` / :class:`SegmentationPairsSource` they
  and the importers build;
- ``scan``: checking a user's files before writing (parallel decoding, what
  was skipped and why, the majority votes, the hash split);
- ``layouts``: a user's folders as train and test sources
  (:func:`image_folder_splits`, :func:`segmentation_folder_splits`);
- ``tfrecords``: other tools' TFRecord files as train and test sources
  (:func:`tfrecord_splits`, :class:`TFRecordImportSource`);
- ``shapes``: :class:`ShapesSource`, a generated segmentation set;
- ``beam_runs``: ``prepare --beam``'s Beam options and the importers' checks
  as an Apache Beam pipeline (the beam extra; the writer is
  :mod:`estimator_keras.beam_write`).

The public names are importable from here too
(``from estimator_keras.sources import IdxSource``). They load on first use.
None of the modules imports TensorFlow: images that must be decoded, resized
or re-encoded are TensorFlow's work, imported then (see
:mod:`~estimator_keras.sources.images`), and ``beam_runs`` needs Apache Beam.

Example::

    images, labels = find_idx_files(DEBIAN_FASHION_MNIST_DIR, "train")
    source = IdxSource(images, labels)
    batch = source.read(np.array([5, 0, 5]))
    batch["image"].shape   # (3, 28, 28, 1), uint8
"""

import importlib

_EXPORTS = {
    "ArraySource": "base",
    "IdxSource": "idx",
    "read_idx": "idx",
    "write_idx": "idx",
    "find_idx_files": "idx",
    "DEBIAN_FASHION_MNIST_DIR": "idx",
    "IDX_IMAGES_MAGIC": "idx",
    "IDX_LABELS_MAGIC": "idx",
    "download_idx": "download",
    "ImageFolderSource": "folders",
    "SegmentationFolderSource": "folders",
    "ImageListSource": "folders",
    "SegmentationPairsSource": "folders",
    "image_folder_splits": "layouts",
    "segmentation_folder_splits": "layouts",
    "tfrecord_splits": "tfrecords",
    "TFRecordImportSource": "tfrecords",
    "ShapesSource": "shapes",
    "SHAPES_CLASSES": "shapes",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
