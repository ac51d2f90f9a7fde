"""Plumbing shared by the benchmark tables: settings, data, timing, targets
(what they print and write is :mod:`benchmarks.output`).

Every table follows one pattern: build each variant once, run one warm-up
window per variant (which also sizes the timed windows), then run the timed
windows round-robin, ``repeats`` times, rotating the starting variant each
round, and report medians. Alternating matters here: the machine is shared
and its speed drifts by tens of percent within a minute, so variants timed
back to back see the same drift and their ratios stay meaningful.
"""

import dataclasses
import logging
import os
import statistics
import sys
import tempfile
import time

from benchmarks.output import fmt_value

logger = logging.getLogger(__name__)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_JSON = os.path.join(HERE, "results", "latest.json")
DATASET_NAME = "fashion_mnist"
IMAGE, LABEL = "image", "label"


@dataclasses.dataclass
class Settings:
    """What one benchmark run measures and how hard.

    Attributes:
      data_dir: a dataset directory (with ``dataset.json``) used as is, or a
        folder where ``fashion_mnist/`` is (or gets) prepared.
      quick: fewer repeats and shorter windows, for development.
      examples: use only the first N training examples (a subset dataset is
        written under ``workdir``); None for all.
      repeats: timed windows per variant (default: each table's own, 3 to 7;
        quick 2).
      window_s: target seconds of one timed window (default 1.5, quick 0.4).
      workdir: scratch folder for model dirs and written datasets.
      batch_size: examples per batch everywhere.
      seed: seeds shuffles and model initialization.
      python_estimator: interpreter with TensorFlow 2.15 and tf.estimator, for
        child processes that need it (None: this one).
      python_keras: interpreter with TensorFlow 2.16+ and tf-keras, for the
        keras table and the runs on that TensorFlow (None: none known).
      accuracy_runs: the accuracy table's runs (None: its default list).
      python_jax: interpreter with Keras 3 and JAX, for the JAX rows of the
        keras and cluster tables (None: this one or the checkout's .venv-jax
        where JAX imports; see :func:`jax_python`).
    """

    data_dir: str = "data"
    quick: bool = False
    examples: int = None
    repeats: int = None
    window_s: float = None
    workdir: str = None
    batch_size: int = 128
    seed: int = 0
    python_estimator: str = None
    python_keras: str = None
    accuracy_runs: list = None
    python_jax: str = None

    def __post_init__(self):
        if self.window_s is None:
            self.window_s = 0.4 if self.quick else 1.5
        if self.workdir is None:
            self.workdir = tempfile.mkdtemp(prefix="ek-bench-")
        os.makedirs(self.workdir, exist_ok=True)

    def repeats_for(self, full):
        """Timed windows per variant: --repeats if given, else 2 with --quick,
        else the table's own ``full`` default."""
        if self.repeats:
            return int(self.repeats)
        return 2 if self.quick else int(full)

    def to_json(self):
        return dataclasses.asdict(self)


def say(message):
    """Progress for people, on stderr (stdout carries the tables)."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def quiet_tensorflow():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    tf.get_logger().setLevel(logging.ERROR)
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    tf.autograph.set_verbosity(0)
    return tf


# --------------------------------------------------------------------------
# Data


def dataset_path(settings):
    """The dataset directory the tables read, prepared first when missing."""
    from estimator_keras import manifest  # pylint: disable=import-outside-toplevel

    base = str(settings.data_dir)
    if os.path.exists(manifest.manifest_path(base)):
        path = base
    else:
        from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel
        from experiments.catalog import datasets, prepare  # pylint: disable=import-outside-toplevel
        catalog.load()
        path = datasets.dataset_dir(base, DATASET_NAME)
        if not datasets.is_prepared(base, DATASET_NAME):
            say(f"preparing {DATASET_NAME} in {base} (one time)")
            prepare.prepare(DATASET_NAME, base, progress=False)
    if settings.examples:
        path = subset_dataset(path, int(settings.examples),
                              os.path.join(settings.workdir, f"subset-{settings.examples}"))
    return path


def subset_dataset(path, n, out):
    """A copy of ``path`` with only its first ``n`` training examples (and its
    whole test split) in up to 8 shards; reused when already written."""
    from estimator_keras import manifest as manifest_lib  # pylint: disable=import-outside-toplevel
    from estimator_keras import records  # pylint: disable=import-outside-toplevel

    if os.path.exists(manifest_lib.manifest_path(out)):
        return out
    manifest = manifest_lib.load_manifest(path)
    splits = {}
    for split in manifest.splits:
        images, labels = load_arrays(path, split)
        if split == "train":
            images, labels = images[:n], labels[:n]
        splits[split] = {IMAGE: images, LABEL: labels}
    shards = {s: max(1, min(8, len(a[LABEL]))) for s, a in splits.items()}
    records.write_dataset(splits, out, num_shards=shards, shuffle=False, progress=False,
                          name=f"{manifest.name or 'dataset'}-subset-{n}",
                          labels=getattr(manifest, "labels", None))
    return out


def experiments_data_dir(settings, path):
    """A ``--data-dir`` for ``python -m experiments`` in which
    ``fashion_mnist/`` is the dataset at ``path`` (a link when it has
    another name)."""
    if os.path.basename(os.path.normpath(path)) == DATASET_NAME:
        return os.path.dirname(os.path.normpath(path))
    folder = os.path.join(settings.workdir, "experiments-data")
    os.makedirs(folder, exist_ok=True)
    link = os.path.join(folder, DATASET_NAME)
    if not os.path.exists(link):
        os.symlink(os.path.abspath(path), link)
    return folder


def run_experiments(args, timeout, python=None, env=None):
    """``python -m experiments ARGS`` from the checkout, in a fresh process
    (killed at the timeout); ``env``: variables to set in it (None: to
    remove). Returns (returncode, stdout, stderr, seconds)."""
    import subprocess  # pylint: disable=import-outside-toplevel

    overrides = env or {}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(HERE),
                                                     env.get("PYTHONPATH")) if p)
    env.pop("TF_CONFIG", None)
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    start = time.perf_counter()
    proc = subprocess.run([python or sys.executable, "-m", "experiments", *map(str, args)],
                          cwd=os.path.dirname(HERE), env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    return proc.returncode, proc.stdout, proc.stderr, time.perf_counter() - start


def jax_python(settings):
    """An interpreter with Keras 3 and JAX for the tables' JAX rows:
    --python-jax, else this one or the checkout's .venv-jax where JAX
    imports; else None (:func:`no_jax_reason` says why)."""
    import subprocess  # pylint: disable=import-outside-toplevel

    candidates = [settings.python_jax] if settings.python_jax else [
        sys.executable, os.path.join(os.path.dirname(HERE), ".venv-jax", "bin", "python")]
    for python in candidates:
        if python and os.path.exists(python) and subprocess.run(
                [python, "-c", "import jax, keras"], capture_output=True, timeout=300,
                check=False).returncode == 0:
            return python
    return None


def no_jax_reason(settings):
    """Why :func:`jax_python` found no interpreter, for the rows it leaves
    unmeasured."""
    if settings.python_jax:
        return f"--python-jax {settings.python_jax} cannot import jax and keras"
    return "no interpreter with Keras 3 and JAX: --python-jax, or .venv-jax in the checkout"


AVERAGE_RE = r"trained to step (\d+): .*?([\d.]+) steps/s(?:, ([\d,]+) examples/s)? on average"


def training_average(text):
    """(step, steps/s, examples/s) from the last "trained to step N: ... on
    average" progress line in ``text``, or None."""
    import re  # pylint: disable=import-outside-toplevel

    found = re.findall(AVERAGE_RE, text)
    if not found:
        return None
    step, rate, examples = found[-1]
    return int(step), float(rate), float(examples.replace(",", "")) if examples else None


def dataset_info(path, split="train"):
    """(files, schema, num_examples, compression) of a split."""
    from estimator_keras import records  # pylint: disable=import-outside-toplevel

    resolved = records.resolve(path, split)
    return resolved


def load_arrays(path, split="train"):
    """The split as numpy arrays ``(images uint8 [N, ...], labels int64 [N])``,
    in file order, read from the records themselves so that every path of a
    benchmark sees the same examples."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    resolved = dataset_info(path, split)
    spec = resolved.schema[IMAGE]
    parse_spec = {IMAGE: tf.io.FixedLenFeature([], tf.string),
                  LABEL: tf.io.FixedLenFeature([], tf.int64)}

    def parse(serialized):
        parsed = tf.io.parse_example(serialized, parse_spec)
        images = tf.reshape(tf.io.decode_raw(parsed[IMAGE], tf.as_dtype(spec.dtype)),
                            [-1, *spec.shape])
        return images, parsed[LABEL]

    ds = tf.data.TFRecordDataset(resolved.files, resolved.compression or "").batch(4096).map(parse)
    images, labels = [], []
    for x, y in ds:
        images.append(x.numpy())
        labels.append(y.numpy())
    return np.concatenate(images), np.concatenate(labels).astype(np.int64)


# --------------------------------------------------------------------------
# Timing


def median(values):
    return statistics.median(values) if values else float("nan")


def window_size(rate, window_s, lo, hi):
    """How many units fill ``window_s`` seconds at ``rate`` units/s."""
    if not rate or rate != rate:
        return lo
    return int(max(lo, min(hi, rate * window_s)))


def warm_window(iterator, epoch, window_s, lo):
    """Reads ``epoch`` + 5 batches of ``iterator`` (a cache fills, buffers
    settle), then times one more ``epoch``: the batches that fill a window
    of ``window_s`` seconds at that rate (at least ``lo``)."""
    for _ in range(epoch + 5):
        next(iterator)
    start = time.perf_counter()
    for _ in range(epoch):
        next(iterator)
    return window_size(epoch / max(time.perf_counter() - start, 1e-9), window_s, lo, 100_000)


class Variant:
    """One thing a table times. Subclasses implement ``build`` (once),
    ``warmup`` (once; also sizes the window) and ``measure`` (one timed
    window, returning (units, seconds)); ``close`` frees what they hold."""

    name = ""
    description = ""
    consumed = ""
    group = ""

    def build(self):
        pass

    def warmup(self):
        self.measure()

    def measure(self):
        raise NotImplementedError

    def close(self):
        pass

    def extra(self):
        """Extra fields for this variant's row in the JSON."""
        return {}


@dataclasses.dataclass
class Measurements:
    """What :func:`run_alternating` measured.

    Attributes:
      samples: {variant name: [rate per window, in time order]}.
      errors: {variant name: error text} for variants that failed.
      log: every window as (variant name, rate), in the order they ran.
      reference: the variant interleaved between the others, or None.
    """

    samples: dict
    errors: dict
    log: list
    reference: str = None


def run_alternating(variants, repeats, label, reference=None, ref_every=3):
    """Times ``variants`` in rounds; returns :class:`Measurements`.

    Each round runs every variant once, the starting variant rotating from
    round to round. With a ``reference`` (a variant name), the reference also
    runs at the start of each round and after every ``ref_every`` other
    variants, so that each window has a reference window at most
    ``ref_every - 1`` windows away: :func:`local_ratio` compares them.
    A variant whose build or measure raises gets its error recorded and
    drops out; the others go on.
    """
    samples = {v.name: [] for v in variants}
    errors, log = {}, []
    live = []
    for v in variants:
        try:
            start = time.perf_counter()
            v.build()
            v.warmup()
            say(f"[{label}] built + warmed {v.name} in {time.perf_counter() - start:.1f}s")
            live.append(v)
        except Exception as e:  # pylint: disable=broad-except
            errors[v.name] = f"{type(e).__name__}: {e}"[:500]
            say(f"[{label}] {v.name} failed: {errors[v.name]}")
    ref = next((v for v in live if v.name == reference), None)
    others = [v for v in live if v is not ref]
    for r in range(repeats):
        k = r % max(1, len(others))
        rotated = others[k:] + others[:k]
        order = []
        if ref is not None:
            order.append(ref)
            for i in range(0, len(rotated), ref_every):
                order += rotated[i:i + ref_every] + [ref]
        else:
            order = rotated
        for v in order:
            if v.name in errors:
                continue
            try:
                units, seconds = v.measure()
            except Exception as e:  # pylint: disable=broad-except
                errors[v.name] = f"{type(e).__name__}: {e}"[:500]
                say(f"[{label}] {v.name} failed: {errors[v.name]}")
                continue
            rate = units / max(seconds, 1e-9)
            samples[v.name].append(rate)
            log.append((v.name, rate))
            say(f"[{label}] round {r + 1}/{repeats} {v.name}: {rate:,.1f}")
    for v in variants:
        try:
            v.close()
        except Exception:  # pylint: disable=broad-except
            pass
    return Measurements(samples, errors, log, reference if ref is not None else None)


def local_ratio(log, a, b):
    """Rate of ``a`` over rate of ``b``, each window compared with the nearest
    windows of the other; the median over windows.

    The variant with fewer windows anchors: each of its windows is divided by
    (or divides) the mean of the nearest window of the other one before it
    and the nearest after it. On a machine whose speed jumps between states
    as other jobs start and stop, windows a few seconds apart usually share a
    state, so this is steadier than the ratio of two medians, which can each
    land in a different state.
    """
    if a == b:
        return 1.0
    n_a = sum(1 for name, _ in log if name == a)
    n_b = sum(1 for name, _ in log if name == b)
    if not n_a or not n_b:
        return None
    anchor, other, invert = (a, b, False) if n_a <= n_b else (b, a, True)
    ratios = []
    for i, (name, rate) in enumerate(log):
        if name != anchor:
            continue
        before = next((r for n, r in reversed(log[:i]) if n == other), None)
        after = next((r for n, r in log[i + 1:] if n == other), None)
        near = [x for x in (before, after) if x is not None]
        local = sum(near) / len(near)
        if local and rate:
            ratios.append(rate / local)
    if not ratios:
        return None
    value = median(ratios)
    return 1.0 / value if invert else value


def rows_from(variants, measurements, reference=None, unit=""):
    """Table rows (dicts): median, spread, best window, and ratios to ``reference``
    (``ratio``: :func:`local_ratio`; ``ratio_of_medians``; ``ratio_best``:
    best window over the reference's best window)."""
    rows = []
    samples, errors, log = measurements.samples, measurements.errors, measurements.log
    ref_samples = samples.get(reference, []) if reference else []
    ref = median(ref_samples) if ref_samples else None
    for v in variants:
        s = samples.get(v.name, [])
        row = {"name": v.name, "group": v.group, "description": v.description,
               "consumed": v.consumed, "unit": unit, "median": median(s) if s else None,
               "min": min(s) if s else None, "max": max(s) if s else None,
               "samples": [round(x, 3) for x in s]}
        if v.name in errors:
            row["error"] = errors[v.name]
        if ref and s:
            row["ratio"] = local_ratio(log, v.name, reference)
            row["ratio_of_medians"] = median(s) / ref
            row["ratio_best"] = max(s) / max(ref_samples)
        row.update(v.extra())
        rows.append(row)
    return rows


def target(tid, description, value, threshold, op=">=", why=None, rounds=None):
    """A target row: ``value op threshold`` -> met (None when unmeasured).

    With ``rounds`` (the value measured in each round of the table, each
    round a fresh process), the value is their median, the row carries
    ``rounds`` and ``spread`` (min, median, max), and the target is met only
    when every round meets it: one swing of a baseline cannot carry it.

    A missed or unmeasured target carries ``why``: the numbers (measured
    value, the need, how far off), then ``why`` when given (the cause, or
    what was measured beside it), also kept alone as ``cause``."""
    checks = {">=": lambda v: v >= threshold, "<": lambda v: v < threshold,
              "<=": lambda v: v <= threshold}
    if op not in checks:
        raise ValueError(f"unknown target operator {op!r}")
    measured = [v for v in rounds if v is not None and v == v] if rounds is not None else None
    if measured:
        value = median(measured)
    met = None
    if value is not None and value == value:
        met = bool(checks[op](value))
    row = {"id": tid, "description": description, "value": value,
           "threshold": threshold, "op": op, "met": met}
    if why:
        row["cause"] = why
    missed = []
    if rounds is not None:
        row["rounds"] = list(rounds)
        if measured:
            row["spread"] = [min(measured), value, max(measured)]
            missed = [(k, v) for k, v in enumerate(rounds, 1)
                      if v is None or v != v or not checks[op](v)]
            met = row["met"] = not missed
        else:
            met = row["met"] = None
    if met is None:
        row["why"] = "not measured" + (f": {why}" if why else "")
    elif not met:
        word = "short" if op == ">=" else "over"
        # The shortfall of the round furthest on the wrong side.
        numbers = [v for _, v in missed if v is not None and v == v]
        worst = value if not numbers else (min(numbers) if op == ">=" else max(numbers))
        gap = (abs(worst - threshold) / abs(threshold)
               if threshold and worst is not None and worst == worst else None)
        # Below a tenth of a percent, "0.0% short" would read as no miss at all.
        share = None if not gap else (f"{gap:.1%}" if gap >= 0.001 else f"{gap * 100:.2g}%")
        off = f" ({'the worst ' if len(numbers) > 1 else ''}{share} {word})" if share else ""
        if missed:
            which = ", ".join(f"round {k}: "
                              f"{fmt_value(v, threshold, op) if v is not None else 'unmeasured'}"
                              for k, v in missed)
            head = (f"{len(missed)} of {len(rounds)} rounds miss ({which}), needs {op} "
                    f"{fmt_value(threshold)}{off}")
        else:
            head = (f"measured {fmt_value(value, threshold, op)}, needs {op} "
                    f"{fmt_value(threshold)}{off}")
        row["why"] = head + (f"; {why}" if why else "")
    return row


def row_median(rows, name):
    for row in rows:
        if row["name"] == name:
            return row["median"]
    return None


def ratio(a, b):
    if a is None or b is None or not b:
        return None
    return a / b
