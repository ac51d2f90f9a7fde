"""The ``prepare`` command: its flags (:func:`add_parser`) and what it does
(:func:`run`).

``prepare NAME`` writes a registered dataset; ``prepare images``,
``prepare segmentation`` and ``prepare tfrecords`` import the user's own
files under ``--name``. TensorFlow-free at import: :func:`run` loads the
writer when it runs.
"""

import argparse
import functools
import importlib
import re
import tempfile

from estimator_keras import manifest
from estimator_keras.errors import UsageError
from experiments.catalog import loading as catalog
from experiments.catalog import registry
from experiments.commands.common import data_dir

_FOLDER_FLAGS = ("name", "image_size", "channels", "test_fraction", "strict")
_TFRECORD_FLAGS = ("source", "test_source", "features", "label", "num_classes", "class_names")

EPILOG = """\
examples:
  prepare fashion_mnist --data-dir data
  prepare images --source-dir photos/ --name photos --image-size 96x96
  prepare segmentation --source-dir scans/ --name scans
  prepare tfrecords --source 'old/train-*' --name old --label image/class/label
  prepare images --source-dir photos/ --name photos --beam --num-workers 4
  prepare images --source-dir gs://B/photos --name photos --data-dir gs://B/data --beam \
      -- --runner DataflowRunner --project P --region R --temp_location gs://B/tmp \
         --setup_file ./setup.py
"""


def add_parser(subparsers):
    """Adds ``prepare`` to the CLI's subparsers; returns its parser."""
    p = subparsers.add_parser(
        "prepare", help="write a dataset as sharded TFRecords: a registered one, or your "
                        "own images, masks or TFRecord files",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset", metavar="DATASET",
                   help="a registered dataset (fashion_mnist, mnist, shapes; see `list`), "
                        "or images, segmentation or tfrecords to import your own files")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="writes DIR/DATASET, or DIR/NAME for your own files (default "
                        "$ESTIMATOR_KERAS_DATA_DIR or ./data)")
    p.add_argument("--source-dir", metavar="DIR",
                   help="a registered dataset's IDX files (default: Debian's "
                        "dataset-fashion-mnist, else download); for images and "
                        "segmentation, the folder to import")
    p.add_argument("--shards", type=int, metavar="N",
                   help="train shards (default: one per 500 examples, at most 8; the test "
                        "split gets N/4, by default at most 2)")
    p.add_argument("--num-workers", type=int, default=1, metavar="N",
                   help="processes checking files and writing shards in parallel")
    p.add_argument("--compression", choices=["none", "gzip"], default="none")
    p.add_argument("--force", action="store_true", help="rewrite a complete dataset")
    p.add_argument("--max-examples", type=int, metavar="N",
                   help="registered datasets: keep only the first N examples of each "
                        "split (quick runs)")
    p.add_argument("--beam", action="store_true",
                   help="write with an Apache Beam pipeline (pip install -e '.[beam]'): on "
                        "this machine with --num-workers processes, or on Dataflow, Flink "
                        "or Spark with Beam's own options after -- (e.g. -- --runner "
                        "DataflowRunner --project P --region R --temp_location gs://...)")
    p.set_defaults(beam_options=[])

    own = p.add_argument_group(
        "your own files (images, segmentation, tfrecords)",
        "images: DIR/<class>/<files>, or DIR/train/<class>/... and DIR/test/<class>/...; "
        "segmentation: DIR/images/* and DIR/masks/* paired by file stem; PNG, JPEG, GIF "
        "and BMP. Unreadable files are skipped and listed.")
    own.add_argument("--name", metavar="NAME", help="the new dataset's name (its folder)")
    own.add_argument("--image-size", metavar="HxW",
                     help="resize every image to H x W, or N x N for N (default: the "
                          "most common size)")
    own.add_argument("--channels", type=int, choices=[1, 3],
                     help="1 grey or 3 RGB (default: what most images are)")
    own.add_argument("--test-fraction", type=float, metavar="F",
                     help="share of each class held out for the test split, chosen by a "
                          "hash of each file's path (default 0.1)")
    own.add_argument("--strict", action="store_true",
                     help="stop at an unreadable file instead of skipping it")

    rec = p.add_argument_group("tfrecords (other tools' TFRecord files)")
    rec.add_argument("--source", metavar="GLOB",
                     help="the TFRecord files (quote the pattern; .gz files work)")
    rec.add_argument("--test-source", metavar="GLOB",
                     help="the test split's files (instead of --test-fraction)")
    rec.add_argument("--features", metavar="NAME=KEY,...",
                     help="dataset features and the record keys they come from (default: "
                          "the image, as feature image, e.g. image=image/encoded)")
    rec.add_argument("--label", metavar="KEY",
                     help="the label's record key (default: label, image/class/label...)")
    rec.add_argument("--num-classes", type=int, metavar="N",
                     help="default: the largest label seen + 1")
    rec.add_argument("--class-names", metavar="A,B,...",
                     help="class names in label order (default: a TFDS label.labels.txt "
                          "beside the files, if any)")
    return p


def parse_image_size(text):
    """'HxW' or 'N' -> (height, width); UsageError otherwise."""
    if text is None:
        return None
    match = re.fullmatch(r"\s*(\d+)\s*(?:[xX]\s*(\d+)\s*)?", str(text))
    size = (int(match.group(1)), int(match.group(2) or match.group(1))) if match else None
    if not size or min(size) < 1:
        raise UsageError(f"--image-size {text!r} must be HxW (e.g. 96x128) or N for N x N, "
                         f"with positive numbers.")
    return size


def parse_features(text):
    """'NAME=KEY,...' -> {name: key} (a bare KEY names itself); None for None."""
    if not text:
        return None
    mapping = {}
    for part in str(text).split(","):
        name, sep, key = part.strip().partition("=")
        name, key = name.strip(), key.strip() if sep else name.strip()
        if not name or not key or name in mapping:
            raise UsageError(f"--features {text!r}: expected NAME=KEY pairs separated by "
                             f"commas, each name once (e.g. image=image/encoded).")
        mapping[name] = key
    return mapping


def _given(args, flags):
    return [f"--{f.replace('_', '-')}" for f in flags
            if getattr(args, f, None) not in (None, False)]


def _refuse(args, flags, what):
    given = _given(args, flags)
    if given:
        raise UsageError(f"{', '.join(given)} {'does' if len(given) == 1 else 'do'} not "
                         f"apply to {what}; see `python -m experiments prepare --help`.")


def beam_options(parser, extra):
    """Beam's own options: the arguments after ``--``. Exits 2 naming any
    other argument ``parser`` does not take."""
    at = extra.index("--") if "--" in extra else len(extra)
    if extra[:at]:
        parser.unrecognized(extra[:at])
    return extra[at + 1:]


def _beam(args):
    """``prepare --beam``'s writer and file checker, as keyword arguments
    for :mod:`experiments.catalog.prepare`; none without ``--beam``."""
    options = getattr(args, "beam_options", None) or []
    if not getattr(args, "beam", False):
        if options:
            raise UsageError(f"the options after -- ({' '.join(options)}) are Apache "
                             f"Beam's, for prepare --beam; add --beam, or drop them.")
        return {}
    # Beam loads only here: the CLI without --beam never imports it.
    runs = importlib.import_module("estimator_keras.sources.beam_runs")
    write = importlib.import_module("estimator_keras.beam_write")
    pipeline = runs.pipeline_options(options, args.num_workers)
    return {"writer": functools.partial(write.write_dataset, options=pipeline),
            "mapper": runs.BeamMapper(pipeline, tempfile.gettempdir())}


def run(args):
    """Runs ``prepare``; prints what was written. Returns the exit status."""
    catalog.check(catalog.load(getattr(args, "modules", None)), getattr(args, "verbose", False))
    prepare = importlib.import_module("experiments.catalog.prepare")
    compression = None if args.compression == "none" else "GZIP"
    beam = _beam(args)
    if args.dataset not in prepare.IMPORTERS:
        if args.dataset not in registry.dataset_names():
            hint = registry.did_you_mean(args.dataset,
                                         registry.dataset_names() + list(prepare.IMPORTERS))
            raise UsageError(f"unknown dataset {args.dataset!r}{hint}; registered: "
                             f"{', '.join(registry.dataset_names())}; or import your own "
                             f"files with prepare images, segmentation or tfrecords.")
        _refuse(args, _FOLDER_FLAGS + _TFRECORD_FLAGS, f"the registered dataset "
                f"{args.dataset!r} (they are for prepare images|segmentation|tfrecords)")
        out = prepare.prepare(args.dataset, data_dir(args), source_dir=args.source_dir,
                              shards=args.shards, num_workers=args.num_workers,
                              compression=compression, force=args.force,
                              max_examples=args.max_examples, writer=beam.get("writer"))
        print(f"dataset {args.dataset} ready in {out} ({_counts(manifest.load_manifest(out))})")
        return 0

    kind = args.dataset
    _refuse(args, ("max_examples",), f"prepare {kind}")
    if not args.name:
        raise UsageError(f"prepare {kind} needs --name NAME: the folder under --data-dir "
                         f"that the dataset is written to.")
    options = {"image_size": parse_image_size(args.image_size), "channels": args.channels,
               "strict": args.strict}
    if kind == "tfrecords":
        _refuse(args, ("source_dir",), "prepare tfrecords (use --source 'GLOB')")
        if not args.source:
            raise UsageError("prepare tfrecords needs --source 'GLOB': the TFRecord files "
                             "to import (quote the pattern).")
        if args.test_source and args.test_fraction is not None:
            raise UsageError("give --test-fraction or --test-source, not both.")
        options.update(pattern=args.source, test_pattern=args.test_source,
                       features=parse_features(args.features), label=args.label,
                       num_classes=args.num_classes,
                       class_names=[n.strip() for n in args.class_names.split(",")]
                       if args.class_names else None)
    else:
        _refuse(args, _TFRECORD_FLAGS, f"prepare {kind}")
        if not args.source_dir:
            raise UsageError(f"prepare {kind} needs --source-dir DIR: the folder to import.")
        options["source_dir"] = args.source_dir
    options["test_fraction"] = 0.1 if args.test_fraction is None else args.test_fraction
    done = prepare.import_files(kind, args.name, data_dir(args), shards=args.shards,
                                num_workers=args.num_workers, compression=compression,
                                force=args.force, **beam, **options)
    print(f"dataset {args.name} ready in {done.directory} ({_counts(done.manifest)})")
    for line in summary(done):
        print(f"  {line}")
    return 0


def _counts(found):
    return ", ".join(f"{s} {v.num_examples}" for s, v in found.splits.items())


def summary(done):
    """The lines that follow ``dataset NAME ready``: what was written, what
    was skipped and why."""
    if done.found is None:
        return ["already prepared (pass --force to import it again)"]
    lines = list(done.found.notes)
    skipped = done.found.skipped
    if skipped:
        more = (f"; and {len(skipped) - 10} more (dataset.json lists the first 50)"
                if len(skipped) > 10 else "")
        lines.append(f"skipped {len(skipped)} {done.found.unit}: "
                     + "; ".join(str(s) for s in skipped[:10]) + more)
    else:
        lines.append("skipped nothing: every input was readable")
    return lines
