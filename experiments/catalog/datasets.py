"""Where prepared datasets live (``DATA_DIR/<name>``) and where the built-in
ones come from; TensorFlow-free, so that listing experiments stays quick.

Datasets are registered with :func:`experiments.catalog.registry.register_dataset`;
:func:`idx_splits` serves the IDX-file ones (MNIST, Fashion-MNIST), and
:mod:`experiments.catalog.prepare` writes them.
"""

import logging
import os
import re
import shlex

from estimator_keras import io, manifest, sources
from estimator_keras.errors import UsageError
from experiments.catalog import registry

logger = logging.getLogger(__name__)


def _idx_dir(name, source_dir, download_dir):
    """Where the IDX files are: --source-dir, Debian's package, or a download."""
    if source_dir:
        return source_dir
    if name == "fashion_mnist" and os.path.isdir(sources.DEBIAN_FASHION_MNIST_DIR):
        logger.info("reading Fashion-MNIST from %s (Debian's dataset-fashion-mnist)",
                    sources.DEBIAN_FASHION_MNIST_DIR)
        return sources.DEBIAN_FASHION_MNIST_DIR
    logger.info("no --source-dir given: downloading %s", name)
    # download_dir None: this user's private, verified download cache.
    return sources.download_idx(name, download_dir)


def idx_splits(name, class_names):
    """The ``splits`` function of an IDX dataset (``mnist``, ``fashion_mnist``),
    whose class ids name ``class_names``."""

    def splits(source_dir=None, download_dir=None):
        directory = _idx_dir(name, source_dir, download_dir)
        found = {}
        for split in ("train", "test"):
            source = sources.IdxSource(*sources.find_idx_files(directory, split))
            source.labels = {"label": {"num_classes": len(class_names),
                                       "class_names": list(class_names)}}
            found[split] = source
        return found

    return splits


class Head:
    """The first ``n`` examples of a source (``prepare --max-examples``), for
    quick experiments and tests on a slice of a real dataset."""

    def __init__(self, source, n):
        self.source, self.n = source, min(int(n), len(source))
        self.features = source.features
        self.labels = getattr(source, "labels", None)

    def __len__(self):
        return self.n

    def read(self, indices):
        return self.source.read(indices)


def dataset_dir(data_dir, name):
    return io.join(str(data_dir), name)


def is_prepared(data_dir, name):
    return io.exists(manifest.manifest_path(dataset_dir(data_dir, name)))


def needs_preparing(name, data_dir):
    """``(directory, missing)``: where dataset ``name`` is (see :func:`find`)
    and whether it is a registered dataset that ``data_dir`` lacks (what
    ``prepare`` would write before training can start)."""
    directory, registered = find(name, data_dir)
    return directory, bool(registered and not is_prepared(data_dir, name))


def find(name, data_dir):
    """Where dataset ``name`` is: ``(directory, registered)``.

    ``name`` is looked up, in order, as a dataset prepared under ``data_dir``,
    a registered dataset (its directory under ``data_dir``, maybe not
    prepared yet: ``registered`` is then True), or the path of a prepared
    dataset directory, local or remote.

    Raises:
      UsageError: none of these, naming what was tried.
    """
    if not name:
        raise UsageError("this experiment trains on any prepared dataset: give --dataset NAME "
                         "(prepared under --data-dir, or registered) or --dataset DIR (a "
                         "folder with a dataset.json).")
    if is_prepared(data_dir, name) and "/" not in name:
        return dataset_dir(data_dir, name), False
    if "/" not in name and name in registry.dataset_names():
        return dataset_dir(data_dir, name), True
    if io.exists(manifest.manifest_path(name)):
        return str(name).rstrip("/"), False
    prepared = [n for n in (io.listdir(data_dir) if io.isdir(data_dir) else [])
                if is_prepared(data_dir, n)]
    # A path names the files to import, never the new dataset: that gets a name.
    is_path = "/" in str(name) or os.sep in str(name) or io.isdir(name)
    if is_path and not io.exists(name):
        raise UsageError(f"--dataset {name!r}: no such folder. Give the folder of a prepared "
                         f"dataset (one holding a dataset.json), or a dataset's name: prepared "
                         f"in {data_dir} ({', '.join(prepared) or 'none'}) or registered "
                         f"({', '.join(registry.dataset_names())}).")
    new_name = suggested_name(name)
    hint = "" if is_path else registry.did_you_mean(name, prepared + registry.dataset_names())
    raise UsageError(
        f"--dataset {name!r}{hint} is neither a dataset prepared in {data_dir} ({', '.join(prepared) or 'none'}), "
        f"nor a registered dataset ({', '.join(registry.dataset_names())}), nor a folder "
        f"holding a dataset.json. Prepare it first, e.g. `python -m experiments prepare images "
        f"--source-dir {shlex.quote(str(name)) if is_path else 'DIR'} --name {new_name} "
        f"--data-dir {shlex.quote(str(data_dir))}`, "
        f"then train with --dataset {new_name}.")


def suggested_name(path):
    """A valid ``prepare --name`` for the files at ``path``: its base name
    with what a folder name may not hold replaced, never a registered one."""
    base = os.path.basename(str(path).rstrip("/"))
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", base).strip("._-") or "my_data"
    taken = set(registry.dataset_names()) | set(registry.RESERVED_DATASET_NAMES)
    return f"my_{name}" if name in taken else name
