"""A user's folders of images, turned into train and test sources.

:func:`image_folder_splits` reads ``DIR/<class>/<files>`` (split by a hash
of each file's path) or ``DIR/train/<class>/...`` and ``DIR/test/<class>/...``;
:func:`segmentation_folder_splits` reads ``DIR/images`` and ``DIR/masks``
(or ``DIR/train/{images,masks}`` and ``DIR/test/{images,masks}``). Every
file is decoded once first: unreadable ones are skipped and reported (or,
with ``strict``, refused), images of other sizes are resized to the most
common size, and grey and colour images are converted to what most files
are. Both return an :class:`~estimator_keras.sources.scan.Imported`.

Example::

    found = image_folder_splits("photos/", image_size=(96, 96))
    write_dataset(found.splits, "data/photos")
    found.skipped   # [Skipped('cats/notes.txt', 'not an image: extension .txt'), ...]
"""

import os

import numpy as np

from estimator_keras import io
from estimator_keras.errors import DataError, UsageError
from estimator_keras.sources.base import preview
from estimator_keras.sources.folders import (
    ImageListSource, SegmentationPairsSource, check_masks, class_folders, pair_by_stem)
from estimator_keras.sources.images import IMAGE_EXTENSIONS, channels_arg, image_size_arg
from estimator_keras.sources.scan import (
    Imported, Skipped, check_images, hash_split, plan_images, refuse_skipped)

_SPLITS = ("train", "test")


def _split_layout(root, inner):
    """{"train": root/train, "test": root/test} when both exist and hold
    ``inner`` (sub-folders, or the named one); else None."""
    dirs = {s: io.join(root, s) for s in _SPLITS}
    for d in dirs.values():
        if not io.isdir(d):
            return None
        if inner and not io.isdir(io.join(d, inner)):
            return None
        if not inner and not class_folders(d):
            return None
    return dirs


def check_fraction(test_fraction):
    """``test_fraction`` as a float in (0, 1); UsageError otherwise."""
    try:
        fraction = float(test_fraction)
    except (TypeError, ValueError):
        fraction = -1.0
    if not 0.0 < fraction < 1.0:
        raise UsageError(f"--test-fraction must be a number between 0 and 1 "
                         f"(exclusive); given {test_fraction!r}.")
    return fraction


def _class_files(split_dir, class_names, rel_prefix):
    """(files relative to split_dir, label ids, skipped) of one split's class
    folders; the names in ``skipped`` carry ``rel_prefix``."""
    files, labels, skipped = [], [], []
    for entry in io.listdir(split_dir):
        if not entry.startswith(".") and not io.isdir(io.join(split_dir, entry)):
            skipped.append(Skipped(f"{rel_prefix}{entry}", "not inside a class folder"))
    for label, name in enumerate(class_names):
        folder = io.join(split_dir, name)
        if not io.isdir(folder):
            continue
        for entry in io.listdir(folder):
            rel = io.join(name, entry)
            if entry.startswith("."):
                continue
            if io.isdir(io.join(folder, entry)):
                skipped.append(Skipped(f"{rel_prefix}{rel}/", "a folder inside a class "
                                       "folder (class folders are not searched deeper)"))
            elif os.path.splitext(entry)[1].lower() not in IMAGE_EXTENSIONS:
                ext = os.path.splitext(entry)[1]
                skipped.append(Skipped(f"{rel_prefix}{rel}", "not an image: " + (
                    f"extension {ext}" if ext else "no extension")))
            else:
                files.append(rel)
                labels.append(label)
    return files, labels, skipped


def _check_classes(root, class_names, dirs, labels, when):
    """DataError for too few classes, no images, or empty class folders.

    ``labels`` holds each split's class ids; a class folder that exists in a
    split but holds none of its examples is empty.
    """
    if not class_names:
        raise DataError(
            f"image folder {root} holds no class sub-folders; expected one folder "
            f"per class (e.g. {root}/cat/*.png, {root}/dog/*.png), or train/ and "
            f"test/ folders that hold them.")
    if len(class_names) < 2:
        raise DataError(
            f"image folder {root} holds a single class folder ({class_names[0]}); "
            f"classification needs at least two classes, one folder each.")
    if not any(len(ids) for ids in labels.values()):
        raise DataError(f"image folder {root} holds no {when}images in any of its "
                        f"{len(class_names)} class folders ({preview(class_names, 5)}); "
                        f"expected {', '.join(IMAGE_EXTENSIONS)} files.")
    present = {s: set(np.asarray(ids).tolist()) for s, ids in labels.items()}
    empty = [io.join(dirs[s], name) for s in labels for label, name in enumerate(class_names)
             if label not in present[s] and io.isdir(io.join(dirs[s], name))]
    if empty:
        raise DataError(
            f"class folders without {when}images: {preview(empty, 5)}. Add images "
            f"({', '.join(IMAGE_EXTENSIONS)}) or remove the folders.")


def image_folder_splits(source_dir, *, image_size=None, channels=None, test_fraction=0.1,
                        strict=False, num_workers=1, progress=True, mapper=None):
    """Train and test :class:`ImageListSource` of a folder of class folders.

    Args:
      source_dir: ``DIR`` holding ``DIR/<class>/<images>``, or ``DIR/train``
        and ``DIR/test`` that each hold class folders. Class names are the
        sorted sub-folder names (of ``train`` in the second layout; a test
        class that train lacks is an error).
      image_size: (height, width) every image is resized to; default the
        most common size.
      channels: 1 or 3; default what most files are (grey or colour).
      test_fraction: share of each class held out for ``test`` in the
        first layout, chosen by a hash of each file's path.
      strict: refuse unreadable files instead of skipping them.
      num_workers: processes decoding files in parallel.
      mapper: runs the decoding instead of worker processes (see
        :func:`~estimator_keras.sources.scan.check_images`).

    Raises:
      DataError: naming the folder, for a missing folder, no class folders,
        a single class, a class folder without readable images, or (with
        ``strict``) the unreadable files.
    """
    root = str(source_dir).rstrip("/") or "/"
    image_size = image_size_arg(image_size)
    chosen_channels = None if channels is None else channels_arg(channels)
    layout = _split_layout(root, None)
    fraction = None if layout else check_fraction(test_fraction)
    if layout:
        class_names = class_folders(layout["train"])
        extra = sorted(set(class_folders(layout["test"])) - set(class_names))
        if extra:
            raise DataError(f"{layout['test']} has class folders that {layout['train']} "
                            f"lacks: {preview(extra, 5)}; the model cannot learn classes "
                            f"it never sees in training.")
    else:
        class_names = class_folders(root)
    dirs = layout or {"all": root}
    first = layout["train"] if layout else root
    listed = {s: _class_files(d, class_names, f"{s}/" if layout else "")
              for s, d in dirs.items()}
    skipped = [entry for _, _, part in listed.values() for entry in part]
    _check_classes(first, class_names, dirs, {s: l for s, (_, l, _) in listed.items()}, "")

    # Every file is decoded once, so that unreadable ones are known before
    # the writer fixes the number of examples.
    entries = [(s, rel, label) for s, (files, labels, _) in listed.items()
               for rel, label in zip(files, labels)]
    results = check_images([io.join(dirs[s], rel) for s, rel, _ in entries], "image",
                           num_workers, progress, f"checking {len(entries)} images in {root}",
                           mapper)
    prefix = "{}/" if layout else ""
    skipped.extend(Skipped(prefix.format(s) + rel, r)
                   for (s, rel, _), r in zip(entries, results) if isinstance(r, str))
    if strict:
        refuse_skipped(skipped, "files")
    kept = [(e, r) for e, r in zip(entries, results) if not isinstance(r, str)]
    _check_classes(first, class_names, dirs,
                   {s: [e[2] for e, _ in kept if e[0] == s] for s in dirs}, "readable ")

    size, channels, encoding, reencode, notes = plan_images([r for _, r in kept], image_size,
                                                            chosen_channels)
    notes.append(f"label: {len(class_names)} classes ({preview(class_names, 20)})")

    def source(rows):
        split = kept[rows[0]][0][0] if len(rows) else "train"
        return ImageListSource(
            dirs.get(split, root), [kept[r][0][1] for r in rows],
            [kept[r][0][2] for r in rows], class_names, shape=size + (channels,),
            encoding=encoding, reencode=reencode[rows])

    rows = _rows_by_split([e for e, _ in kept], layout, fraction)
    splits = {s: source(r) for s, r in rows.items()}
    _check_test_split(splits["test"], root)
    return Imported(splits, skipped, notes, root)


def _rows_by_split(entries, layout, fraction):
    """{split: rows of ``entries`` ((split, key, class id) each)}: as the
    folders say, or train and test by a hash of each key within its class."""
    if layout:
        return {s: np.array([r for r, e in enumerate(entries) if e[0] == s], dtype=np.int64)
                for s in _SPLITS}
    test = hash_split([e[1] for e in entries], [e[2] for e in entries], fraction)
    return {"train": np.flatnonzero(~test), "test": np.flatnonzero(test)}


def _check_test_split(source, root):
    if not len(source):
        raise DataError(f"the test split of {root} is empty: its classes are too small "
                        f"for the test fraction. Add images or raise --test-fraction.")


def segmentation_folder_splits(source_dir, *, image_size=None, channels=None,
                               test_fraction=0.1, strict=False, num_workers=1,
                               progress=True, mapper=None):
    """Train and test :class:`SegmentationPairsSource` of image / mask folders.

    ``DIR/images/*`` pair with ``DIR/masks/*`` by file stem (the test split
    is chosen by a hash of each stem), or ``DIR/train/{images,masks}`` and
    ``DIR/test/{images,masks}``. Mask pixel values are class ids; the number
    of classes (largest id + 1, over both splits) goes into ``labels``.
    Arguments as for :func:`image_folder_splits`; images are resized
    bilinearly, masks by nearest neighbour.

    Raises:
      DataError: unpaired files (named by stem), masks that are not grayscale
        PNGs or not of their image's size, no readable pairs.
    """
    root = str(source_dir).rstrip("/") or "/"
    image_size = image_size_arg(image_size)
    chosen_channels = None if channels is None else channels_arg(channels)
    if not io.isdir(root):
        raise DataError(f"segmentation folder {root} does not exist or is not a folder.")
    layout = _split_layout(root, "images")
    if not layout and not io.isdir(io.join(root, "images")):
        raise DataError(f"segmentation folder {root} has no images/ folder; expected "
                        f"{root}/images/* and {root}/masks/* paired by file stem (or "
                        f"train/ and test/ folders that each hold both).")
    fraction = None if layout else check_fraction(test_fraction)
    dirs = layout or {"all": root}
    entries, skipped = [], []
    for split, d in dirs.items():
        stems, images, masks, others = pair_by_stem(io.join(d, "images"), io.join(d, "masks"))
        entries.extend(zip([split] * len(stems), stems, images, masks))
        skipped.extend(Skipped(o, "not an image: extension "
                               + (os.path.splitext(o)[1] or "none")) for o in others)

    image_paths = [io.join(dirs[s], "images", name) for s, _, name, _ in entries]
    mask_paths = [io.join(dirs[s], "masks", name) for s, _, _, name in entries]
    image_results = check_images(image_paths, "image", num_workers, progress,
                                 f"checking {len(image_paths)} images", mapper)
    mask_results = check_images(mask_paths, "mask", num_workers, progress,
                                f"checking {len(mask_paths)} masks", mapper)
    kept = []
    for entry, ipath, iresult, mpath, mresult in zip(
            entries, image_paths, image_results, mask_paths, mask_results):
        for path, result in ((ipath, iresult), (mpath, mresult)):
            if isinstance(result, str):
                skipped.append(Skipped(path, result))
        if not isinstance(iresult, str) and not isinstance(mresult, str):
            kept.append((entry, iresult, mresult[0], mresult[1], ipath, mpath))
    if strict:
        refuse_skipped(skipped, "files")
    if not kept:
        raise DataError(f"segmentation folder {root} holds no readable image / mask pairs.")
    check_masks([k[4] for k in kept], [k[1] for k in kept], [k[5] for k in kept],
                [k[2] for k in kept])
    num_classes = max(k[3] for k in kept) + 1

    size, channels, encoding, reencode, notes = plan_images(
        [k[1] for k in kept], image_size, chosen_channels, " (masks too)")
    notes.append(f"mask: {num_classes} classes (largest class id {num_classes - 1})")

    def source(rows):
        split = kept[rows[0]][0][0] if len(rows) else "train"
        d = dirs.get(split, root)
        return SegmentationPairsSource(
            io.join(d, "images"), io.join(d, "masks"), [kept[r][0][2] for r in rows],
            [kept[r][0][3] for r in rows], shape=size + (channels,), encoding=encoding,
            reencode=reencode[rows], mask_infos=[kept[r][2] for r in rows],
            num_classes=num_classes)

    # Stems hash into the test split whatever the class ids their masks hold.
    rows = _rows_by_split([(s, stem, 0) for (s, stem, _, _), *_ in kept], layout, fraction)
    splits = {s: source(r) for s, r in rows.items()}
    _check_test_split(splits["test"], root)
    return Imported(splits, skipped, notes, root)
