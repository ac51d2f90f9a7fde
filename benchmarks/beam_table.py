"""Table "beam": ``prepare images`` by the built-in writer and by Apache
Beam's local runner, images/s and peak memory.

Folders of N JPEG files (10 class folders of real Fashion-MNIST training
images, or, without Fashion-MNIST, images drawn with a fixed seed) are
written once into the scratch folder. Every ``prepare images`` then runs in
a fresh child Python process (:func:`benchmarks.writing_table.run_child`),
timed around :func:`experiments.catalog.prepare.import_files` (TensorFlow's and
Beam's imports excluded), with its peak resident memory and that of its
worker processes (``RUSAGE_CHILDREN``: Beam's SDK workers, or the built-in
writer's spawned processes). Variants alternate.

Variants at each N: the built-in writer in one process, and ``--beam`` on
Beam's FnApiRunner with 1 worker (in this process) and 2 worker processes.
"""

import importlib
import json
import os
import resource
import shutil
import sys
import time

import numpy as np

from benchmarks import common, output, writing_table

TABLE = "beam"
TITLE = "prepare images: built-in writer vs Apache Beam's local runner, images/s, peak RSS"
SIZES = (2000, 8000, 32000)
QUICK_SIZES = (500, 2000)
CLASSES = 10


def _images(n):
    """``n`` 28x28 grey images and their labels (0-9)."""
    from estimator_keras.sources import idx  # pylint: disable=import-outside-toplevel
    if os.path.isdir(idx.DEBIAN_FASHION_MNIST_DIR):
        source = idx.IdxSource(*idx.find_idx_files(idx.DEBIAN_FASHION_MNIST_DIR, "train"))
        batch = source.read(np.arange(n))
        return batch["image"][..., 0], batch["label"], "Fashion-MNIST"
    rng = np.random.default_rng(42)
    return (rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
            np.arange(n) % CLASSES, "generated (seed 42)")


def make_folder(root, n):
    """``root/<class>/<i>.jpg`` for ``n`` images; returns where they came from."""
    from PIL import Image  # pylint: disable=import-outside-toplevel
    images, labels, origin = _images(n)
    for i, (image, label) in enumerate(zip(images, labels)):
        folder = os.path.join(root, f"class_{int(label)}")
        os.makedirs(folder, exist_ok=True)
        Image.fromarray(image).save(os.path.join(folder, f"{i:06d}.jpg"), quality=90)
    return origin


def child_main(argv=None):
    """Entry of a prepare child: argv[0] is a JSON job; prints a JSON result."""
    job = json.loads((argv or sys.argv[1:])[0])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # TensorFlow's import (and Beam's, below) is not what the table times.
    importlib.import_module("tensorflow")
    from experiments.catalog import prepare  # pylint: disable=import-outside-toplevel
    extra = {}
    if job["beam"]:
        import functools  # pylint: disable=import-outside-toplevel
        from estimator_keras import beam_write  # pylint: disable=import-outside-toplevel
        from estimator_keras.sources import beam_runs  # pylint: disable=import-outside-toplevel
        beam_runs.import_beam()
        options = beam_runs.pipeline_options([], job["workers"])
        extra = {"writer": functools.partial(beam_write.write_dataset, options=options),
                 "mapper": beam_runs.BeamMapper(options, os.path.dirname(job["out"]))}
    baseline = writing_table.peak_rss_mb(resource.RUSAGE_SELF)
    start = time.perf_counter()
    done = prepare.import_files("images", "ds", job["out"], num_workers=job["workers"],
                                force=True, progress=False, source_dir=job["src"],
                                image_size=None, channels=None, test_fraction=0.1,
                                strict=False, **extra)
    seconds = time.perf_counter() - start
    print(json.dumps({
        "seconds": seconds,
        "examples": sum(s.num_examples for s in done.manifest.splits.values()),
        "bytes": sum(s.num_bytes for v in done.manifest.splits.values() for s in v.shards),
        "shards": sum(len(v.shards) for v in done.manifest.splits.values()),
        "rss_after_import_mb": baseline,
        "peak_rss_self_mb": writing_table.peak_rss_mb(resource.RUSAGE_SELF),
        "peak_rss_workers_mb": writing_table.peak_rss_mb(resource.RUSAGE_CHILDREN),
        "vm_hwm_mb": output.proc_status_mb("VmHWM")}))
    return 0


class PrepareVariant(common.Variant):
    consumed = "child process, prepare.import_files timed inside"

    def __init__(self, name, n, beam, workers, settings, folders, description=""):
        self.name, self.n, self.beam, self.workers = name, n, beam, workers
        self.settings, self.folders, self.description = settings, folders, description
        self.group = f"N={n}"
        self.results = []

    def build(self):
        self.out = os.path.join(self.settings.workdir, "beam", "data",
                                self.name.replace(" ", "_").replace("=", ""))
        os.makedirs(self.out, exist_ok=True)

    def warmup(self):
        pass

    def measure(self):
        shutil.rmtree(self.out, ignore_errors=True)
        os.makedirs(self.out)
        result = writing_table.run_child(
            {"beam": self.beam, "workers": self.workers, "src": self.folders[self.n],
             "out": self.out}, module="benchmarks.beam_table")
        shutil.rmtree(self.out, ignore_errors=True)
        self.results.append(result)
        return self.n, result["seconds"]

    def extra(self):
        if not self.results:
            return {}

        def med(key):
            return common.median([r[key] for r in self.results])

        # With one process any "child" is a short fork+exec helper whose
        # ru_maxrss mirrors the parent's at fork time: only workers count.
        workers = self.workers > 1
        return {"images": self.n, "examples": self.results[0]["examples"],
                "shards": self.results[0]["shards"], "workers": self.workers,
                "prepare_s": med("seconds"), "child_wall_s": med("child_wall_s"),
                "peak_rss_self_mb": med("peak_rss_self_mb"),
                "peak_rss_workers_mb": med("peak_rss_workers_mb") if workers else None,
                "peak_rss_mb": common.median([max(r["peak_rss_self_mb"],
                                                  r["peak_rss_workers_mb"] if workers else 0)
                                              for r in self.results]),
                "runs": self.results}


def run(settings, path=None, size=None):  # pylint: disable=unused-argument
    """Runs the table at :data:`SIZES` images (``--quick``: :data:`QUICK_SIZES`;
    ``--examples N``: N alone)."""
    sizes = ((int(size or settings.examples),) if (size or settings.examples)
             else QUICK_SIZES if settings.quick else SIZES)
    folders, origin = {}, None
    for n in sizes:
        folders[n] = os.path.join(settings.workdir, "beam", f"images-{n}")
        shutil.rmtree(folders[n], ignore_errors=True)
        origin = make_folder(folders[n], n)
    vs = []
    for n in sizes:
        vs += [PrepareVariant(f"N={n} built-in", n, False, 1, settings, folders,
                              "prepare images, the built-in writer, 1 process"),
               PrepareVariant(f"N={n} beam workers=1", n, True, 1, settings, folders,
                              "prepare images --beam, FnApiRunner in_memory"),
               PrepareVariant(f"N={n} beam workers=2", n, True, 2, settings, folders,
                              "prepare images --beam --num-workers 2, FnApiRunner "
                              "multi_processing")]
    load_start = output.load_average()
    m = common.run_alternating(vs, settings.repeats_for(1), TABLE)
    rows = common.rows_from(vs, m, reference=vs[0].name, unit="images/s")
    for n in sizes:
        shutil.rmtree(folders[n], ignore_errors=True)
    return {"table": TABLE, "title": TITLE, "unit": "images/s", "rows": rows,
            "columns": ["name", "median", "prepare_s", "child_wall_s", "shards",
                        "peak_rss_self_mb", "peak_rss_workers_mb", "peak_rss_mb"],
            "targets": [], "sizes": list(sizes), "images_from": origin,
            "load_before": load_start, "load_after": output.load_average(),
            "notes": ["images/s times prepare.import_files only (listing, the check of every "
                      "file, the split, the write, the manifest); child_wall_s adds Python, "
                      "TensorFlow and Beam start",
                      "peak RSS from ru_maxrss: self = the prepare process, workers = the "
                      "largest of its worker processes (Beam's SDK workers, with 2 workers "
                      "only); peak_rss_mb = the larger of the two",
                      "JPEG files, 28x28 grey, quality 90, in 10 class folders; the Beam "
                      "rows run two pipelines (the check, then the write)"]}
