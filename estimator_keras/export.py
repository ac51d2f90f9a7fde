"""Checkpoint -> files plain Keras loads.

:func:`export_model` restores a checkpoint of either engine the one correct
way (into an uncompiled model, see :mod:`estimator_keras.checkpoints`)
and writes:

- ``model.h5``: architecture + weights; ``tf.keras.models.load_model(path,
  compile=False)`` loads it with no custom objects;
- ``weights.h5``: the weights alone, for ``model.load_weights``;
- ``saved_model/``: signatures ``serving_default`` (raw inputs keyed by the
  experiment's feature names) and ``serve_examples`` (serialized
  tf.train.Example strings in the dataset's schema), both returning
  ``probabilities``, ``class_id`` and ``class_name`` whatever the model's
  layers are called (see :mod:`estimator_keras.signatures`);
- ``export.json``: the checkpoint, step, the signatures' inputs and outputs,
  and the metrics it came from.

The export is built under a temporary name and swapped in with renames, so
an interrupted export leaves the previous one intact.
:func:`export_if_best` keeps ``MODEL_DIR/best`` for the best evaluation.
TensorFlow is imported by the Keras 2 export alone (:func:`export_model`):
the rest serves the keras3 engine's exports too, with or without it.

Example::

    export_model(build_model, "/tmp/run", schema=schema,
                 features={"image": "image"})
    # elsewhere, without this package:
    model = tf.keras.models.load_model("/tmp/run/export/model.h5", compile=False)
"""

import json
import logging
import tempfile
import threading

from estimator_keras import checkpoints, io
from estimator_keras.errors import ModelDirError
from estimator_keras.modeldir import pid_alive
from estimator_keras.signatures import (serving_input_names, serving_output_names,
                                        serving_signatures)

# pylint: disable=import-outside-toplevel  (TensorFlow, for a Keras 2 model's export)

logger = logging.getLogger(__name__)

EXPORT_DIR = "export"
BEST_DIR = "best"
EXPORT_INFO = "export.json"
# Where a group's chief sets the best evaluation's checkpoint aside (BestCandidate).
CANDIDATE_DIR = "best-candidate"
CANDIDATE_INFO = "candidate.json"


def serving_functions(model, schema=None, features=None, class_names=None,
                      output_activation=None):
    """The two SavedModel signatures of a Keras 2 model (see
    :func:`estimator_keras.signatures.serving_signatures`)."""
    import tensorflow as tf

    specs = {name: tf.TensorSpec(shape=t.shape, dtype=t.dtype, name=name)
             for name, t in zip(model.input_names, model.inputs)}
    return serving_signatures(lambda inputs: model(inputs, training=False), specs,
                              [t.shape for t in model.outputs], schema=schema,
                              features=features, class_names=class_names,
                              activation=output_activation)


def serving_info(specs, output_shapes, *, schema=None, features=None, class_names=None,
                 output_activation=None):
    """What export.json says of the signatures: ``inputs`` (signature
    input name -> shape without the batch axis, dtype), ``outputs`` (the keys
    they return) and, for a logits model, ``output_activation`` (what the
    signatures apply to the output of ``model.h5``'s ``predict``)."""
    served = serving_input_names(specs, schema, features)
    info = {"inputs": {served[n]: {"shape": list(s.shape)[1:], "dtype": s.dtype.name}
                       for n, s in specs.items()},
            "outputs": serving_output_names(output_shapes, class_names)}
    if output_activation:
        info["output_activation"] = output_activation
    return info


def export_model(model_builder, model_dir, *, checkpoint=None, schema=None, features=None,
                 export_dir=None, metadata=None, class_names=None, flat=False,
                 output_activation=None):
    """Writes ``model.h5``, ``weights.h5``, ``saved_model/`` and ``export.json``.

    Args:
      model_builder: a callable returning the (uncompiled) Keras model, or
        the model itself; its weights are replaced by the checkpoint's.
      model_dir: the model dir holding the checkpoints.
      checkpoint: a checkpoint prefix; default the latest in ``model_dir``.
      schema: the dataset's schema, for the ``serve_examples`` signature
        (omitted when schema is None).
      features: the input -> feature map of that signature.
      export_dir: default ``MODEL_DIR/export``.
      metadata: extra JSON-able facts for ``export.json`` (metrics, name).
      class_names: the label's class names in class-id order: listed in
        ``export.json``, and a classifier's signatures return ``class_name``.
      flat: the SavedModel at the root of ``export_dir`` (``saved_model.pb``,
        ``variables/``) instead of in ``saved_model/``: the layout Vertex AI's
        Model Registry imports from ``AIP_MODEL_DIR``.
      output_activation: "softmax" or "sigmoid" for a model that outputs
        logits (see :func:`estimator_keras.losses.output_activation`): the
        signatures return its output with it applied.

    Returns:
      The export directory.
    """
    import tensorflow as tf

    model_dir = str(model_dir)
    checkpoint = checkpoint or checkpoints.latest_checkpoint(model_dir)
    export_dir = str(export_dir or io.join(model_dir, EXPORT_DIR)).rstrip("/")
    model = model_builder() if callable(model_builder) and not isinstance(
        model_builder, tf.keras.Model) else model_builder
    checkpoints.load_checkpoint_into(model, checkpoint)
    step = checkpoints.checkpoint_step(checkpoint)

    def write(staging):
        # The SavedModel first: saving it flat wants the folder to itself.
        tf.saved_model.save(model, staging if flat else io.join(staging, "saved_model"),
                            signatures=serving_functions(model, schema, features, class_names,
                                                         output_activation))
        model.save(io.join(staging, "model.h5"), save_format="h5",
                   include_optimizer=False)
        model.save_weights(io.join(staging, "weights.h5"))
        specs = {n: tf.TensorSpec(t.shape, t.dtype) for n, t in zip(model.input_names,
                                                                     model.inputs)}
        info = {"checkpoint": checkpoint, "global_step": step,
                **serving_info(specs, [t.shape for t in model.outputs], schema=schema,
                               features=features, class_names=class_names,
                               output_activation=output_activation),
                "features": features, **(metadata or {})}
        if class_names:
            info["class_names"] = [str(n) for n in class_names]
        io.atomic_write(io.join(staging, EXPORT_INFO),
                        json.dumps(info, indent=2, default=str))

    return write_staged(export_dir, write)


def write_staged(export_dir, write):
    """Calls ``write(folder)`` on a fresh staging folder and swaps the folder
    in as ``export_dir``: an export that fails or is killed midway leaves the
    previous one intact. Returns ``export_dir``."""
    export_dir = str(export_dir).rstrip("/")
    parent = io.parent(export_dir)
    io.makedirs(parent)
    prefix = _staging_prefix(export_dir)
    remote = io.is_remote(export_dir)
    # Built next to the destination when local (one rename swaps it in), else
    # locally and copied: h5py cannot write to gs://.
    if not remote:
        remove_stale_staging(export_dir)
    staging = io.new_dir(tempfile.gettempdir() if remote else parent, prefix)
    try:
        write(staging)
        if remote:
            remote_tmp = io.temporary_name(export_dir)
            try:
                io.copy_tree(staging, remote_tmp)
                io.swap_in(remote_tmp, export_dir)
            except BaseException:
                io.rmtree(remote_tmp)
                raise
        else:
            io.swap_in(staging, export_dir)
    finally:
        io.rmtree(staging)
    return export_dir


def _staging_prefix(export_dir):
    # Named after the target: the evaluator's best export and the chief's
    # final one may be staged in the same folder at the same time.
    return f".{io.basename(export_dir)}{io.TMP_MARK}"


def remove_stale_staging(export_dir):
    """Removes what exports to ``export_dir`` killed midway left beside it."""
    parent = io.parent(str(export_dir).rstrip("/"))
    if io.is_remote(parent):
        return
    for stale in io.stale_entries(parent, _staging_prefix(export_dir) + "*", pid_alive):
        io.rmtree(io.join(parent, stale))


def recover_export(export_dir):
    """After a crash between the two renames of an export's swap, puts the
    previous export back. Returns True when it did."""
    if io.recover_swap(export_dir):
        logger.warning("restored the previous export %s after an interrupted export",
                       export_dir)
        return True
    return False


def export_if_best(model_builder, model_dir, checkpoint, metrics, metric,
                   higher_is_better=True, *, schema=None, features=None, log=None,
                   class_names=None, exporter=None, output_activation=None):
    """Exports ``checkpoint`` to ``MODEL_DIR/best`` when its ``metric`` beats
    the one recorded there; returns the export dir, or None when not better.
    ``exporter`` writes it (default :func:`export_model`; the keras3 engine
    passes :func:`estimator_keras.engines.keras3.export.export_model`).

    Runs the export on a fresh thread: the caller may be inside a finalized
    Estimator graph or a distribution strategy's scope, and neither may leak
    into building the export's model.
    """
    if metric not in metrics:
        raise ModelDirError(
            f"best-model export: metric {metric!r} is not among the eval "
            f"metrics {sorted(metrics)}.")
    value = float(metrics[metric])
    target = io.join(str(model_dir), BEST_DIR)
    best = _recorded_metric(target, metric)
    better = best is None or (value > best if higher_is_better else value < best)
    if not better:
        return None
    _in_eager_thread(
        exporter or export_model, model_builder, model_dir, checkpoint=checkpoint, schema=schema,
        features=features, export_dir=target, class_names=class_names,
        output_activation=output_activation, metadata={
            "metrics": {k: float(v) for k, v in metrics.items()}, "best_metric": metric})
    (log or logger.info)(f"new best {metric} {value:.4f}: exported {target}")
    return target


class BestCandidate:
    """``MODEL_DIR/best`` written once, when training ends, for a run whose
    other processes would wait for every export (a JAX process group: they
    meet the chief in the next step's collective). At each evaluation that
    beats both ``best/`` and the candidate held, :meth:`consider` copies its
    checkpoint (one file: the keras3 engine's) to ``MODEL_DIR/best-candidate``
    with its metrics, which costs a file copy instead of an export;
    :meth:`export` then writes ``best/`` from it. A run that dies first
    leaves the candidate to the next run's end.

    Example::

        best = BestCandidate(model_dir, "accuracy")
        best.consider(checkpoint, {"accuracy": 0.91})   # at each evaluation
        best.export(build_model, engine.export_if_best, schema=schema)
    """

    def __init__(self, model_dir, metric, higher_is_better=True):
        self.model_dir, self.metric, self.higher = str(model_dir), metric, higher_is_better
        self.dir = io.join(self.model_dir, CANDIDATE_DIR)
        self.info = self._read()

    def _read(self):
        path = io.join(self.dir, CANDIDATE_INFO)
        if not io.exists(path):
            return None
        try:
            info = json.loads(io.read_text(path))
            float(info["metrics"][self.metric])
            checkpoint = io.child(self.dir, info["file"], f"{path}'s \"file\"")
        except (ValueError, KeyError, TypeError) as e:
            raise ModelDirError(
                f"{path} is damaged ({e}); it should name a checkpoint file beside it and "
                f"its metrics, {self.metric!r} among them. Delete {self.dir} (the best "
                f"evaluation since MODEL_DIR/best was written is then forgotten).") from e
        return info if io.exists(checkpoint) else None

    def _better(self, value, than):
        return than is None or (value > than if self.higher else value < than)

    def consider(self, checkpoint, metrics):
        """Sets ``checkpoint`` aside when its ``metrics`` beat ``best/`` and
        the candidate held; returns whether it did."""
        if self.metric not in metrics:
            raise ModelDirError(f"best-model export: metric {self.metric!r} is not among the "
                                f"eval metrics {sorted(metrics)}.")
        value = float(metrics[self.metric])
        held = float(self.info["metrics"][self.metric]) if self.info else None
        recorded = _recorded_metric(io.join(self.model_dir, BEST_DIR), self.metric)
        if not (self._better(value, held) and self._better(value, recorded)):
            return False
        name = io.basename(str(checkpoint))
        io.makedirs(self.dir)
        io.copy_file(checkpoint, io.join(self.dir, name))
        info = {"file": name, "checkpoint": str(checkpoint),
                "metrics": {k: float(v) for k, v in metrics.items()}}
        io.atomic_write(io.join(self.dir, CANDIDATE_INFO), json.dumps(info, indent=1) + "\n")
        if self.info and self.info["file"] != name:
            io.remove(io.join(self.dir, self.info["file"]))
        self.info = info
        return True

    def export(self, model_builder, export_if_best, **options):
        """Writes ``best/`` from the candidate where it still beats it (with
        ``export_if_best``, an engine's), then drops the candidate; returns
        the export dir, or None."""
        if self.info is None:
            return None
        target = export_if_best(model_builder, self.model_dir,
                                io.join(self.dir, self.info["file"]), self.info["metrics"],
                                self.metric, self.higher, **options)
        io.rmtree(self.dir)
        self.info = None
        return target


def _in_eager_thread(fn, *args, **kwargs):
    """Runs fn on a new thread and returns its result. Exporters are called
    inside the evaluation's finalized graph; the default graph is per thread,
    so a fresh thread builds the Keras model eagerly, as an export needs."""
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


def read_export_info(export_dir):
    """The export.json of an export as a dict, or None when there is none
    (or it is unreadable: then the export counts as missing)."""
    path = io.join(str(export_dir), EXPORT_INFO)
    if not io.exists(path):
        return None
    try:
        info = json.loads(io.read_text(path))
    except ValueError:
        return None
    return info if isinstance(info, dict) else None


def is_export_of(info, checkpoint):
    """Whether an export.json (a dict, or None) belongs to ``checkpoint``;
    by the checkpoint's own name, so that a moved model dir still matches."""
    return bool(info) and io.basename(str(info.get("checkpoint") or "")) == io.basename(
        str(checkpoint))


def _recorded_metric(export_dir, metric):
    try:
        return float(read_export_info(export_dir)["metrics"][metric])
    except (KeyError, TypeError, ValueError):
        return None
