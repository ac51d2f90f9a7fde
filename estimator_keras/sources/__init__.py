"""Example sources: readers of source formats that the dataset writer consumes.

Every source follows one protocol (``features``, ``len``, ``read(indices)``),
described in :mod:`estimator_keras.sources.base`. Modules:

- ``base``: the protocol's shared plumbing and :class:`ArraySource` (numpy arrays);
- ``idx``: MNIST / Fashion-MNIST IDX files: :func:`read_idx`, :func:`write_idx`,
  :class:`IdxSource`, :func:`find_idx_files`;
- ``download``: :func:`download_idx`, fetching MNIST / Fashion-MNIST as IDX files;
- ``images``: PNG / JPEG header probing and the bytes stored per image;
- ``folders``: :class:`ImageFolderSource` (a sub-folder per class) and
  :class:`SegmentationFolderSource` (image / mask pairs matched by file stem);
- ``shapes``: :class:`ShapesSource`, a generated segmentation set.

The public names are importable from here too
(``from estimator_keras.sources import IdxSource``). They load on first use,
so importing this package does not import TensorFlow; only the image and
download modules need it.

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
