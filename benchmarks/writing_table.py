"""Table "writing": writing TFRecord datasets, speed and peak memory.

Every write runs in a fresh child Python process, which reports the time of
the ``write_dataset`` call (TensorFlow's import excluded), the bytes
written, and its peak resident memory (``ru_maxrss`` of itself, and of its
worker processes via ``RUSAGE_CHILDREN``); the parent also reads the
child's own peak from ``os.wait4``. Writes alternate between variants.

Variants: a generated source of S and 4S 28x28 examples (an example depends
only on its index, so the source is a few bytes and pickles into workers),
written by 1 process and by ``num_workers=2``; and the real Fashion-MNIST
``prepare`` (IDX files -> 60k + 10k records) with 1 and 2 workers. The
memory target: peak RSS grows < 10% from S to 4S examples.
"""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

from benchmarks import common, output

TABLE = "writing"
TITLE = "writing records: examples/s, MB/s, peak RSS"
CHILD_TIMEOUT_S = 600
NUM_SHARDS = 8


class GeneratedSource:
    """``n`` Fashion-MNIST-shaped examples computed from their index: a
    28x28x1 uint8 image and an int64 label. Follows the example-source
    protocol of :mod:`estimator_keras.sources` (``features``, ``len``,
    ``read(indices)``) and pickles as two integers."""

    def __init__(self, n, seed=0):
        self.n, self.seed = int(n), int(seed)

    @property
    def features(self):
        from estimator_keras.schema import FeatureSpec  # pylint: disable=import-outside-toplevel
        return {"image": FeatureSpec("image", "uint8", (28, 28, 1), "raw"),
                "label": FeatureSpec("label", "int64", (), "int64")}

    def __len__(self):
        return self.n

    def read(self, indices):
        idx = np.asarray(indices, dtype=np.uint64)
        pixels = np.arange(28 * 28, dtype=np.uint64)
        # A cheap integer hash of (seed, index, pixel): varied bytes, no RNG state.
        h = (idx[:, None] * np.uint64(2654435761) + pixels[None, :] * np.uint64(40503)
             + np.uint64(self.seed * 97 + 1))
        h ^= h >> np.uint64(13)
        images = (h & np.uint64(0xFF)).astype(np.uint8).reshape(len(idx), 28, 28, 1)
        labels = (idx % np.uint64(10)).astype(np.int64)
        return {"image": images, "label": labels}


def peak_rss_mb(kind):
    # ru_maxrss is in kilobytes on Linux.
    return resource.getrusage(kind).ru_maxrss / 1024.0




def child_main(argv=None):
    """Entry of a writer child: argv[0] is a JSON job; prints a JSON result."""
    job = json.loads((argv or sys.argv[1:])[0])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    from estimator_keras import records  # pylint: disable=import-outside-toplevel

    baseline = peak_rss_mb(resource.RUSAGE_SELF)
    start = time.perf_counter()
    if job["kind"] == "generated":
        manifest = records.write_dataset(
            {"train": GeneratedSource(job["n"])}, job["out"], num_shards=NUM_SHARDS,
            num_workers=job["workers"], progress=False, seed=0)
    else:
        from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel
        from experiments.catalog import prepare  # pylint: disable=import-outside-toplevel
        catalog.load()
        out = prepare.prepare("fashion_mnist", job["out"], num_workers=job["workers"],
                              force=True, progress=False)
        manifest = records.load_manifest(out)
    seconds = time.perf_counter() - start
    examples = sum(split.num_examples for split in manifest.splits.values())
    nbytes = sum(s.num_bytes for split in manifest.splits.values() for s in split.shards)
    print(json.dumps({
        "seconds": seconds, "examples": examples, "bytes": nbytes,
        "rss_after_import_mb": baseline,
        "peak_rss_self_mb": peak_rss_mb(resource.RUSAGE_SELF),
        "peak_rss_workers_mb": peak_rss_mb(resource.RUSAGE_CHILDREN),
        "vm_hwm_mb": output.proc_status_mb("VmHWM")}))
    return 0


def run_child(job, timeout=CHILD_TIMEOUT_S, module="benchmarks.writing_table"):
    """Runs one write in a child process (``module``'s ``child_main``);
    returns its result dict (with the child's wall time and peak RSS as seen
    by os.wait4 added)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(common.HERE),
                                                    env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    code = f"import sys; from {module} import child_main; sys.exit(child_main())"
    start = time.perf_counter()
    out_path = os.path.join(os.path.dirname(job["out"]),
                            f"child-{os.getpid()}-{time.time_ns()}.json")
    with open(out_path, "w") as out, open(os.devnull, "w") as devnull:
        proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(job)], stdout=out,
                                stderr=devnull, env=env)
        deadline = time.monotonic() + timeout
        status = usage = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                os.kill(proc.pid, signal.SIGKILL)
                os.wait4(proc.pid, 0)
                raise TimeoutError(f"writer child {proc.pid} ran past {timeout} s")
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    with open(out_path) as f:
        text = f.read().strip().splitlines()
    os.remove(out_path)
    if proc.returncode != 0 or not text:
        raise RuntimeError(f"writer child exited with status {proc.returncode}")
    result = json.loads(text[-1])
    result["child_wall_s"] = wall
    result["peak_rss_wait4_mb"] = usage.ru_maxrss / 1024.0
    return result


class WriteVariant(common.Variant):
    consumed = "child process, write_dataset timed inside"

    def __init__(self, name, kind, n, workers, settings, description="", group="baseline"):
        self.name, self.kind, self.n, self.workers = name, kind, n, workers
        self.settings, self.description, self.group = settings, description, group
        self.results = []

    def build(self):
        self.out = os.path.join(self.settings.workdir, "writing",
                                self.name.replace(" ", "_").replace("=", ""))
        os.makedirs(os.path.dirname(self.out), exist_ok=True)

    def warmup(self):
        pass

    def measure(self):
        shutil.rmtree(self.out, ignore_errors=True)
        result = run_child({"kind": self.kind, "n": self.n, "workers": self.workers,
                            "out": self.out})
        shutil.rmtree(self.out, ignore_errors=True)
        self.results.append(result)
        return result["examples"], result["seconds"]

    def extra(self):
        if not self.results:
            return {}

        def med(key):
            return common.median([r[key] for r in self.results if r.get(key) is not None])

        seconds = med("seconds")
        # With one process any "child" is a short fork+exec helper whose
        # ru_maxrss mirrors the parent's at fork time: only workers count.
        peak = common.median([max(r["peak_rss_self_mb"],
                                  r["peak_rss_workers_mb"] if self.workers > 1 else 0)
                              for r in self.results])
        return {"examples": self.results[0]["examples"], "workers": self.workers,
                "mb_per_s": common.median([r["bytes"] / r["seconds"] / 1e6 for r in self.results]),
                "write_s": seconds, "child_wall_s": med("child_wall_s"),
                "peak_rss_self_mb": med("peak_rss_self_mb"),
                "peak_rss_workers_mb": med("peak_rss_workers_mb") if self.workers > 1 else None,
                "peak_rss_mb": peak, "rss_after_import_mb": med("rss_after_import_mb"),
                "runs": self.results}


def run(settings, path=None, size=None):  # pylint: disable=unused-argument
    """Runs the table. ``size`` is S (default 60000, quick 15000, or --examples)."""
    s = int(size or settings.examples or (15000 if settings.quick else 60000))
    repeats = settings.repeats_for(3)
    vs = [
        WriteVariant(f"generated S={s} workers=1", "generated", s, 1, settings,
                     "write_dataset of a generated source, 1 process"),
        WriteVariant(f"generated S={s} workers=2", "generated", s, 2, settings,
                     "the same, num_workers=2 (spawned workers)"),
        WriteVariant(f"generated 4S={4 * s} workers=1", "generated", 4 * s, 1, settings,
                     "4x the examples, 1 process"),
        WriteVariant(f"generated 4S={4 * s} workers=2", "generated", 4 * s, 2, settings,
                     "4x the examples, num_workers=2"),
    ]
    if not settings.quick and not settings.examples:
        vs += [
            WriteVariant("prepare fashion_mnist workers=1", "prepare", None, 1, settings,
                         "experiments prepare: IDX -> 60k + 10k records", group="real"),
            WriteVariant("prepare fashion_mnist workers=2", "prepare", None, 2, settings,
                         "the same with num_workers=2", group="real"),
        ]
    load_start = output.load_average()
    m = common.run_alternating(vs, repeats, TABLE)
    rows = common.rows_from(vs, m, reference=vs[0].name, unit="examples/s")
    by = {r["name"]: r for r in rows}
    targets = []
    for workers in (1, 2):
        small = by.get(f"generated S={s} workers={workers}", {}).get("peak_rss_mb")
        large = by.get(f"generated 4S={4 * s} workers={workers}", {}).get("peak_rss_mb")
        growth = (large / small - 1) if small and large else None
        targets.append(common.target(
            f"writing.rss_growth.workers{workers}",
            f"peak RSS growth S -> 4S, {workers} process(es) (fraction; max of parent "
            f"and workers)", growth, 0.10, op="<"))
    return {"table": TABLE, "title": TITLE, "unit": "examples/s", "rows": rows,
            "columns": ["name", "median", "ratio", "mb_per_s", "write_s", "child_wall_s",
                        "peak_rss_self_mb", "peak_rss_workers_mb"],
            "targets": targets, "size": s, "load_before": load_start,
            "load_after": output.load_average(),
            "notes": ["examples/s and MB/s time the write_dataset/prepare call only; "
                      "child_wall_s adds Python + TensorFlow start (and, with workers, "
                      "their spawn and TensorFlow import)",
                      "peak RSS from ru_maxrss: parent = the writer process, workers = "
                      "largest spawned worker"]}
