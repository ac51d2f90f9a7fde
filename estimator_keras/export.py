"""Estimator checkpoint -> files plain Keras loads.

An estimator checkpoint loads correctly into Keras only one way: into an
*uncompiled* model of the same architecture, with
``model.load_weights(checkpoint_path)``. (A compiled model with a v2.11+
optimizer refuses it, and ``tf.train.Checkpoint(model=m).restore`` silently
restores wrong weights.) :func:`export_model` does that once and writes:

- ``model.h5``: architecture + weights; ``tf.keras.models.load_model(path,
  compile=False)`` loads it with no custom objects;
- ``weights.h5``: the weights alone, for ``model.load_weights``;
- ``saved_model/``: signatures ``serving_default`` (raw inputs keyed by the
  model's input names) and ``serve_examples`` (serialized tf.train.Example
  strings in the dataset's schema);
- ``export.json``: the checkpoint, step, inputs and metrics it came from.

The export is built under a temporary name and swapped in with renames, so
an interrupted export leaves the previous one intact.

Example::

    export_model(build_model, "/tmp/run", schema=schema,
                 features={"image": "image"})
    # elsewhere, without this package:
    model = tf.keras.models.load_model("/tmp/run/export/model.h5", compile=False)
"""

import json
import logging
import os
import posixpath
import shutil
import tempfile

from estimator_keras.errors import ModelDirError

logger = logging.getLogger(__name__)

EXPORT_DIR = "export"


def _is_remote(path):
    return "://" in str(path)


def latest_checkpoint(model_dir):
    """The newest checkpoint prefix in ``model_dir``; ModelDirError if none."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    ckpt = tf.train.latest_checkpoint(str(model_dir))
    if ckpt is None:
        raise ModelDirError(f"{model_dir} holds no checkpoint: train first "
                            f"(`python -m experiments train ... --model-dir {model_dir}`).")
    return ckpt


def load_checkpoint_into(model, checkpoint):
    """Restores an estimator checkpoint into an uncompiled Keras model.

    Every weight of the model must be found in the checkpoint with the same
    shape; otherwise ModelDirError lists what does not match (the checkpoint
    belongs to another architecture).
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    check_compatible(model, checkpoint)
    status = model.load_weights(checkpoint)
    status.assert_existing_objects_matched().expect_partial()
    return model


def _model_checkpoint_keys(model):
    """Checkpoint key -> variable for each weight, as object-based
    checkpoints name them (``layer_with_weights-N/kernel/...``)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    keys = {}
    with tempfile.TemporaryDirectory() as tmp:
        prefix = tf.train.Checkpoint(model=model).write(os.path.join(tmp, "probe"))
        reader = tf.train.load_checkpoint(prefix)
        for key, shape in reader.get_variable_to_shape_map().items():
            if key.startswith("model/") and "OPTIMIZER_SLOT" not in key:
                keys[key[len("model/"):]] = tuple(shape)
    return keys


def check_compatible(model, checkpoint):
    """Raises ModelDirError naming every weight missing from ``checkpoint`` or
    of another shape there."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    wanted = _model_checkpoint_keys(model)
    try:
        have = tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map()
    except (tf.errors.OpError, ValueError) as e:
        raise ModelDirError(f"cannot read checkpoint {checkpoint}: {e}") from e
    have = {k: tuple(v) for k, v in have.items()}
    missing = sorted(k for k in wanted if k not in have)
    mismatched = sorted(f"{k}: model {wanted[k]}, checkpoint {have[k]}"
                        for k in wanted if k in have and have[k] != wanted[k])
    if missing or mismatched:
        lines = [f"checkpoint {checkpoint} does not fit this model's architecture "
                 f"(a model dir of another model?); refusing to restore it."]
        if mismatched:
            lines.append("shape mismatches: " + "; ".join(mismatched[:10]))
        if missing:
            lines.append("missing from the checkpoint: " + ", ".join(
                k.split("/.ATTRIBUTES")[0] for k in missing[:10]))
        lines.append("Use a fresh --model-dir for a different model.")
        raise ModelDirError(" ".join(lines))


def serving_functions(model, schema=None, features=None):
    """The two SavedModel signatures: raw inputs, and serialized Examples."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    specs = {name: tf.TensorSpec(shape=t.shape, dtype=t.dtype, name=name)
             for name, t in zip(model.input_names, model.inputs)}

    @tf.function(input_signature=[specs])
    def serve_raw(inputs):
        return _outputs_dict(model, model(inputs, training=False))

    signatures = {"serving_default": serve_raw}
    if schema is not None:
        from estimator_keras.inputs import feature_map, parse_examples_fn  # pylint: disable=import-outside-toplevel
        mapping = feature_map(schema, features, label=None) if features is not None else {
            n: n for n in model.input_names}
        parse = parse_examples_fn(schema, mapping)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
        def serve_examples(examples):
            inputs = parse(examples)
            inputs = {k: tf.cast(v, specs[k].dtype) for k, v in inputs.items()}
            return _outputs_dict(model, model(inputs, training=False))

        signatures["serve_examples"] = serve_examples
    return signatures


def _outputs_dict(model, outputs):
    if not isinstance(outputs, (list, tuple)):
        outputs = [outputs]
    return dict(zip(model.output_names, outputs))


def export_model(model_builder, model_dir, *, checkpoint=None, schema=None, features=None,
                 export_dir=None, metadata=None):
    """Writes ``model.h5``, ``weights.h5``, ``saved_model/`` and ``export.json``.

    Args:
      model_builder: a callable returning the (uncompiled) Keras model, or
        the model itself; its weights are replaced by the checkpoint's.
      model_dir: the estimator's model dir.
      checkpoint: a checkpoint prefix; default the latest in ``model_dir``.
      schema, features: the dataset's schema and the input -> feature map,
        for the ``serve_examples`` signature (omitted when schema is None).
      export_dir: default ``MODEL_DIR/export``.
      metadata: extra JSON-able facts for ``export.json`` (metrics, name).

    Returns:
      The export directory.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    model_dir = str(model_dir)
    checkpoint = checkpoint or latest_checkpoint(model_dir)
    export_dir = str(export_dir or posixpath.join(model_dir, EXPORT_DIR))
    model = model_builder() if callable(model_builder) and not isinstance(
        model_builder, tf.keras.Model) else model_builder
    load_checkpoint_into(model, checkpoint)
    from estimator_keras.fit import checkpoint_step  # pylint: disable=import-outside-toplevel
    step = checkpoint_step(checkpoint)

    parent = posixpath.dirname(export_dir.rstrip("/")) or "."
    tf.io.gfile.makedirs(parent)
    # Build next to the destination when local (one rename swaps it in),
    # else locally and copy: h5py cannot write to gs://.
    stage_root = parent if not _is_remote(export_dir) else None
    # Named after the target: the evaluator's best export and the chief's
    # final one may be staged in the same folder at the same time.
    prefix = f".{posixpath.basename(export_dir.rstrip('/'))}.tmp-"
    if stage_root:
        _remove_stale_staging(stage_root, prefix)
    staging = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=stage_root)
    # mkdtemp makes it owner-only; the export is for everyone the umask allows.
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)
    try:
        model.save(os.path.join(staging, "model.h5"), save_format="h5",
                   include_optimizer=False)
        model.save_weights(os.path.join(staging, "weights.h5"))
        tf.saved_model.save(model, os.path.join(staging, "saved_model"),
                            signatures=serving_functions(model, schema, features))
        info = {"checkpoint": checkpoint, "global_step": step,
                "inputs": {n: {"shape": list(t.shape)[1:], "dtype": t.dtype.name}
                           for n, t in zip(model.input_names, model.inputs)},
                "outputs": list(model.output_names),
                "features": features, **(metadata or {})}
        with open(os.path.join(staging, "export.json"), "w") as f:
            json.dump(info, f, indent=2, default=str)
        if _is_remote(export_dir):
            remote_tmp = export_dir.rstrip("/") + f".tmp-{os.getpid()}"
            _copy_tree(staging, remote_tmp)
            _swap_in(remote_tmp, export_dir)
        else:
            _swap_in(staging, export_dir)
    finally:
        if os.path.isdir(staging):
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("exported step %s of %s to %s", step, checkpoint, export_dir)
    return export_dir


def _remove_stale_staging(parent, prefix):
    """Staging dirs of exports to the same target whose process is gone
    (killed midway); never a complete export."""
    from estimator_keras.modeldir import pid_alive  # pylint: disable=import-outside-toplevel

    for name in os.listdir(parent):
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or not pid_alive(int(pid)) or int(pid) == os.getpid():
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _copy_tree(src, dst):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    for root, _, files in os.walk(src):
        rel = os.path.relpath(root, src)
        target = dst if rel == "." else posixpath.join(dst, rel.replace(os.sep, "/"))
        tf.io.gfile.makedirs(target)
        for name in files:
            tf.io.gfile.copy(os.path.join(root, name), posixpath.join(target, name),
                             overwrite=True)


def _swap_in(new, dest):
    """Replaces ``dest`` by ``new``. The old export is moved aside first and
    deleted last, so some complete export exists at every moment."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    old = None
    if tf.io.gfile.exists(dest):
        old = dest.rstrip("/") + f".old-{os.getpid()}"
        tf.io.gfile.rename(dest, old, overwrite=True)
    tf.io.gfile.rename(new, dest)
    if old is not None:
        tf.io.gfile.rmtree(old)


def recover_export(export_dir):
    """After a crash between the two renames of :func:`_swap_in`, puts the
    previous export back. Returns True when it did."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    export_dir = str(export_dir).rstrip("/")
    if tf.io.gfile.exists(export_dir):
        return False
    parent, base = posixpath.split(export_dir)
    olds = sorted(n.rstrip("/") for n in tf.io.gfile.listdir(parent or ".")
                  if n.rstrip("/").startswith(base + ".old-"))
    if not olds:
        return False
    tf.io.gfile.rename(posixpath.join(parent, olds[-1]), export_dir)
    logger.warning("restored the previous export %s after an interrupted export",
                   export_dir)
    return True


BEST_DIR = "best"


class BestExporter:
    """Keeps the Keras export of the best checkpoint by an eval metric.

    Pass it in ``train_and_evaluate(..., exporters=[...])``: after every
    evaluation it compares the metric with the best so far (remembered in
    ``BEST_DIR/export.json``, so restarts keep it) and, when better, writes
    the same files as :func:`export_model` into ``MODEL_DIR/best``.

    Built lazily as a ``tf.estimator.Exporter`` subclass so that importing
    this module does not import TensorFlow.

    Example::

        best = BestExporter(build_model, "accuracy", higher_is_better=True)
        train_and_evaluate(est, train_fn, eval_fn, max_steps=5000, exporters=[best])
    """

    def __new__(cls, model_builder, metric, higher_is_better=True, schema=None,
                features=None, log=None):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        class _BestExporter(tf.estimator.Exporter):
            @property
            def name(self):
                return "best_keras"

            def export(self, estimator, export_path, checkpoint_path, eval_result,
                       is_the_final_export):
                del export_path, is_the_final_export  # we export next to the model dir
                return export_if_best(
                    model_builder, estimator.model_dir, checkpoint_path, eval_result, metric,
                    higher_is_better, schema=schema, features=features, log=log)

        return _BestExporter()


def export_if_best(model_builder, model_dir, checkpoint, metrics, metric,
                   higher_is_better=True, *, schema=None, features=None, log=None):
    """Exports ``checkpoint`` to ``MODEL_DIR/best`` when its ``metric`` beats
    the one recorded there; returns the export dir, or None when not better.

    Runs the export on a fresh thread: the caller may be inside a finalized
    Estimator graph or a distribution strategy's scope, and neither may leak
    into building the export's model.
    """
    if metric not in metrics:
        raise ModelDirError(
            f"best-model export: metric {metric!r} is not among the eval "
            f"metrics {sorted(metrics)}.")
    value = float(metrics[metric])
    target = posixpath.join(str(model_dir), BEST_DIR)
    best = _recorded_metric(target, metric)
    better = best is None or (value > best if higher_is_better else value < best)
    if not better:
        return None
    _in_eager_thread(
        export_model, model_builder, model_dir, checkpoint=checkpoint, schema=schema,
        features=features, export_dir=target, metadata={
            "metrics": {k: float(v) for k, v in metrics.items()}, "best_metric": metric})
    (log or logger.info)(f"new best {metric} {value:.4f}: exported {target}")
    return target


def _in_eager_thread(fn, *args, **kwargs):
    """Runs fn on a new thread and returns its result. Exporters are called
    inside the evaluation's finalized graph; the default graph is per thread,
    so a fresh thread builds the Keras model eagerly, as an export needs."""
    import threading  # pylint: disable=import-outside-toplevel

    outcome = {}

    def run():
        try:
            outcome["value"] = fn(*args, **kwargs)
        except BaseException as e:  # pylint: disable=broad-except  (re-raised below)
            outcome["error"] = e

    thread = threading.Thread(target=run, name="keras-export")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def _recorded_metric(export_dir, metric):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    path = posixpath.join(export_dir, "export.json")
    if not tf.io.gfile.exists(path):
        return None
    try:
        with tf.io.gfile.GFile(path) as f:
            return float(json.load(f)["metrics"][metric])
    except (ValueError, KeyError, TypeError):
        return None
