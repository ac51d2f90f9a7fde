"""Resident memory of a training pipeline, epoch after epoch, in a fresh process.

The child builds ``make_dataset(training=True)`` with the given InputConfig
overrides, reads ``epochs`` epochs batch by batch (eager iteration), and
records VmRSS before the first batch and after each epoch; as a training
run does, it caps malloc's arenas first and hands free heap memory back after
each epoch (:mod:`estimator_keras.memory`; the engines do it after each
checkpoint), unless ``--keep-free-memory``. The parent gets
the list and the growth from epoch 2 to the last. A fresh process per
measurement: memory that another variant allocated cannot hide or inflate
this one's.

Example::

    python -m benchmarks.cache_memory DATA_DIR --epochs 10 --overrides '{"cache": true}'
    # tf.data's own autotune RAM budget (half the memory) instead of the package's:
    python -m benchmarks.cache_memory DATA_DIR --overrides '{"autotune_ram_mb": 12000}'
    # malloc left as glibc sets it (no arena cap, no release after each epoch):
    python -m benchmarks.cache_memory DATA_DIR --keep-free-memory --overrides '{"cache": true}'
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

from benchmarks import common, output
from benchmarks.common import IMAGE, LABEL

CHILD_TIMEOUT_S = 1800


def measure(path, epochs=10, batch_size=128, overrides=None, timeout=CHILD_TIMEOUT_S,
            release=True):
    """Runs the child; returns its result dict (``rss_mb``: before, then one
    value per epoch; ``growth``: (last - epoch 2) / epoch 2; ``cache_mb``:
    epoch 1 minus before). ``release``: the child caps malloc's arenas and
    hands free heap memory back after each epoch, as a training run does
    (:mod:`estimator_keras.memory`)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.dirname(common.HERE), env.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "benchmarks.cache_memory", str(path), "--epochs", str(epochs),
            "--batch-size", str(batch_size), "--overrides", json.dumps(overrides or {})]
    if not release:
        argv.append("--keep-free-memory")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"cache_memory child failed ({proc.returncode}): "
                           f"{proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def growth(rss, first_epoch=2):
    """(rss after the last epoch - after epoch ``first_epoch``) / the latter;
    ``rss[0]`` is before the first batch."""
    if len(rss) <= first_epoch or not rss[first_epoch]:
        return None
    return (rss[-1] - rss[first_epoch]) / rss[first_epoch]


def _child(args):
    import gc  # pylint: disable=import-outside-toplevel

    from estimator_keras import memory  # pylint: disable=import-outside-toplevel

    release = not args.keep_free_memory
    if release:
        memory.limit_arenas()  # as python -m experiments does, before TensorFlow
    common.quiet_tensorflow()
    from estimator_keras import inputs, records  # pylint: disable=import-outside-toplevel

    overrides = json.loads(args.overrides)
    resolved = records.resolve(args.path, "train")
    dataset = inputs.make_dataset(resolved, args.batch_size, training=True,
                                  features={IMAGE: IMAGE}, label=LABEL, **overrides)
    per_epoch = math.ceil(resolved.num_examples / args.batch_size)
    iterator = iter(dataset)
    rss, seconds = [output.rss_mb()], []
    for _ in range(args.epochs):
        start = time.perf_counter()
        for _ in range(per_epoch):
            next(iterator)
        seconds.append(time.perf_counter() - start)
        gc.collect()
        if release:
            memory.release_free_memory()
        rss.append(output.rss_mb())
    print(json.dumps({"overrides": overrides, "epochs": args.epochs,
                      "release": release,
                      "examples": resolved.num_examples, "rss_mb": rss,
                      "epoch_s": seconds, "growth": growth(rss),
                      "cache_mb": rss[1] - rss[0] if rss[0] else None}))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cache_memory", allow_abbrev=False,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="dataset directory")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--overrides", default="{}", help="InputConfig overrides, JSON")
    parser.add_argument("--keep-free-memory", action="store_true",
                        help="neither cap malloc's arenas nor hand free heap memory back "
                             "after each epoch (python -m experiments and the engines do)")
    _child(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
