"""The keras3 engine's checkpoints: Keras 3 weights files in MODEL_DIR.

A checkpoint is ``ckpt-<step>.weights.h5``, written by Keras 3's
``Model.save_weights``: the model's weights and, for a compiled model, the
optimizer's state (its step counter and slots), so that a resumed run
continues the optimizer where it stopped; and the random layers' seed
states (:mod:`.seeds`), so that their draws continue too. It is the same
file on every backend: a checkpoint written on TensorFlow resumes on JAX
and back.

``keras3-checkpoints.json`` names the latest and every kept checkpoint,
oldest first (``{"latest": "ckpt-300.weights.h5", "all": [...]}``), and,
in a model dir continued from another engine whose optimizer state could
not move, the step at which the optimizer's own count started
(``"optimizer_from": 300``: its step counter reads the run's step less
that). Each weights file is written under a temporary name and renamed,
then the index is replaced atomically, and only then are the checkpoints
past ``keep`` deleted: a crash at any point leaves an index that names
whole files.

This module imports Keras only to save, restore and compare with a model: a
runner can ask for the latest checkpoint and its step, and a launcher whether
a model dir holds any (:func:`find`), without loading a backend.

Example::

    path = save(model, "/tmp/run", step=300, keep=5)
    assert latest("/tmp/run") == path and step_of(path) == 300
    restore(new_model, path)
"""

import json
import os
import re
import shutil
import tempfile
import textwrap
import uuid

from estimator_keras import io
from estimator_keras.engines.keras3 import seeds
from estimator_keras.errors import CheckpointMismatchError, EngineMismatchError, ModelDirError
from estimator_keras.modeldir import pid_alive

INDEX = "keras3-checkpoints.json"
SUFFIX = ".weights.h5"
# A file being written: the writer's pid follows (see io.stale_entries).
_TMP_PREFIX = ".ckpt" + io.TMP_MARK
_NAME = re.compile(r"^ckpt-(\d+)\.weights\.h5$")


def name_of(step):
    """``ckpt-<step>.weights.h5``."""
    return f"ckpt-{int(step)}{SUFFIX}"


def is_checkpoint(path):
    """Whether ``path`` names a keras3 checkpoint (by its file name)."""
    return bool(path) and _NAME.match(io.basename(str(path))) is not None


def step_of(path):
    """The training step of a checkpoint, from its name."""
    match = _NAME.match(io.basename(str(path)))
    if match is None:
        raise ModelDirError(f"{path} is not a keras3 checkpoint (expected a file named "
                            f"ckpt-<step>{SUFFIX}).")
    return int(match.group(1))


def _read_index(model_dir):
    path = io.join(model_dir, INDEX)
    if not io.exists(path):
        return None
    try:
        index = json.loads(io.read_text(path))
        names = [str(n) for n in index["all"]]
        latest = str(index["latest"])
        start = index.get("optimizer_from", 0)
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise ValueError(f"optimizer_from is {start!r}, not a step")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ModelDirError(f"{path} is damaged ({e}); it should hold "
                            f'{{"latest": "{name_of(0)}", "all": [...]}}. Delete it to '
                            f"train from scratch, or restore it from a backup.") from e
    for name in names + [latest]:
        if not _NAME.match(name):
            raise ModelDirError(f"{path} names {name!r}, which is not a checkpoint "
                                f"(ckpt-<step>{SUFFIX}).")
    return {"latest": latest, "all": names, "optimizer_from": start}


def find(model_dir):
    """The newest checkpoint in ``model_dir``, or None; what the keras3
    engine has left there even when the index is damaged or missing (then
    the highest step among the files' names). For the guarantees that ask
    whether a model dir holds keras3 checkpoints, not for resuming (see
    :func:`latest`)."""
    model_dir = str(model_dir)
    try:
        index = _read_index(model_dir)
    except ModelDirError:
        index = None
    if index and io.exists(io.join(model_dir, index["latest"])):
        return io.join(model_dir, index["latest"])
    names = [n for n in (io.listdir(model_dir) if io.isdir(model_dir) else []) if _NAME.match(n)]
    return io.join(model_dir, max(names, key=step_of)) if names else None


def present(model_dir):
    """Whether the keras3 engine has checkpointed in ``model_dir``: its index
    or a checkpoint file is there."""
    return io.exists(io.join(str(model_dir), INDEX)) or find(model_dir) is not None


def refuse_other_engine(model_dir, engine):
    """Raises EngineMismatchError when this engine has checkpointed in
    ``model_dir`` and ``engine`` (a Keras 2 engine) would continue it: Keras
    2 cannot read Keras 3 weights files, and resuming from an older
    TensorFlow checkpoint beside them would lose their steps. The message
    says what to use instead."""
    found = find(model_dir)
    if found is None:
        return
    raise EngineMismatchError(
        f"{model_dir} was trained by the keras3 engine (Keras 3): its checkpoint {found} is a "
        f"Keras 3 weights file, which the {engine} engine (Keras 2) cannot restore. Continue "
        f"this model dir with --engine keras3, or move the weights to a new --model-dir by "
        f"hand: {io.join(model_dir, 'export', 'weights.h5')} (every keras3 export writes it) "
        f"loads into the same builder's Keras 2 model with model.load_weights(path).")


def all_checkpoints(model_dir):
    """Paths of the kept checkpoints, oldest first (empty without an index)."""
    index = _read_index(model_dir)
    return [io.join(model_dir, n) for n in index["all"]] if index else []


def latest(model_dir):
    """The newest checkpoint's path, or None when ``model_dir`` has none."""
    index = _read_index(model_dir)
    if not index:
        return None
    path = io.join(model_dir, index["latest"])
    if not io.exists(path):
        raise ModelDirError(f"{io.join(model_dir, INDEX)} names {index['latest']}, which is "
                            f"missing from {model_dir}. Restore the file, or delete the index "
                            f"to train from scratch.")
    return path


def optimizer_start_of(model_dir):
    """The step at which the optimizer's own count started in ``model_dir``
    (see the module's docstring); 0 where it counts the run's steps."""
    index = _read_index(model_dir)
    return index["optimizer_from"] if index else 0


def save(model, model_dir, step, keep, optimizer_from=0):
    """Writes ``model`` (with its optimizer's state) as the checkpoint of
    ``step``, makes it the latest and keeps the newest ``keep``; returns its
    path. ``optimizer_from``: the step the optimizer's count started at."""
    io.makedirs(model_dir)
    name = name_of(step)
    path = io.join(model_dir, name)
    if not io.is_remote(model_dir):
        # What a killed writer left half-written.
        for stale in io.stale_entries(model_dir, _TMP_PREFIX + "*", pid_alive):
            io.remove(io.join(model_dir, stale))
    # Keras insists on the .weights.h5 ending, temporary names included.
    tmp = io.join(model_dir, f"{_TMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}{SUFFIX}")
    try:
        seeds.save_weights(model, tmp)
        io.rename(tmp, path, overwrite=True)
    except BaseException:
        io.remove(tmp)
        raise
    index = _read_index(model_dir) or {"all": []}
    names = [n for n in index["all"] if n != name] + [name]
    names.sort(key=step_of)
    keep = max(1, int(keep))
    kept, dropped = names[-keep:], names[:-keep]
    if name not in kept:
        # Saving an older step than the kept ones (a rerun from an earlier
        # checkpoint): it is the latest all the same.
        kept, dropped = kept[1:] + [name], dropped[:-1] + kept[:1]
    written = {"latest": name, "all": kept}
    if optimizer_from:
        written["optimizer_from"] = int(optimizer_from)
    io.atomic_write(io.join(model_dir, INDEX), json.dumps(written, indent=1) + "\n")
    for old in dropped:
        if old != name:
            io.remove(io.join(model_dir, old))
    return path


def restore(model, path):
    """Loads a checkpoint into ``model``; a compiled model gets its optimizer
    state too (the optimizer is built first, or Keras would skip it).
    Returns the checkpoint's step.

    Raises:
      ModelDirError: the file does not fit the model (another architecture),
        or its optimizer's step counter is not the one the index expects.
    """
    step = step_of(path)
    expected = step - optimizer_start_of(io.parent(str(path)))
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    try:
        model.load_weights(str(path))
    except (ValueError, KeyError) as e:
        # Name the weights that differ; Keras' own words only for what
        # names and shapes do not explain.
        check_fits(model, path)
        raise ModelDirError(
            f"checkpoint {path} does not fit this model's architecture (a model dir of another "
            f"model?); refusing to restore it. Keras says: {_short(e)} Use a fresh --model-dir "
            f"for a different model.") from e
    if optimizer is not None and int(optimizer.iterations.numpy()) != expected:
        raise ModelDirError(
            f"checkpoint {path} holds no optimizer state of this model's optimizer "
            f"({type(optimizer).__name__}): its step counter reads "
            f"{int(optimizer.iterations.numpy())}, not {expected}. Was the optimizer changed? "
            f"Train with the optimizer it was written with, or start a fresh --model-dir.")
    return step


def check_fits(model, path):
    """Raises ModelDirError (:class:`~estimator_keras.errors.CheckpointMismatchError`)
    naming each weight of ``model`` that the checkpoint ``path`` lacks or
    holds in another shape, and each it holds that the model lacks; reads
    names and shapes only, assigns nothing. The optimizer's state is not
    compared (an uncompiled model has none)."""
    have = _weights_in(path)
    folder = tempfile.mkdtemp(prefix="estimator-keras-fit-")
    try:
        probe = os.path.join(folder, name_of(0))
        model.save_weights(probe)
        wanted = _weights_in(probe)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    mismatched = [f"{key} ({wanted[key][1]}): model {wanted[key][0]}, checkpoint {have[key][0]}"
                  for key in sorted(wanted) if key in have and have[key][0] != wanted[key][0]]
    missing = [f"{key} ({wanted[key][1]})" for key in sorted(wanted) if key not in have]
    unexpected = [f"{key} ({have[key][1]})" for key in sorted(have) if key not in wanted]
    if mismatched or missing or unexpected:
        raise CheckpointMismatchError(path, mismatched, missing, unexpected)


def _weights_in(path):
    """{name: (shape, "layer 'L'")} of the model weights in a Keras 3
    weights file (``layers/dense/vars/0``: Keras names a layer's group by its
    class, the layer's own name is an attribute); the optimizer's and the
    seed states are left out. Read with h5py, which Keras 3 writes these
    files with."""
    import h5py  # pylint: disable=import-outside-toplevel  (a dependency of Keras 3)

    found = {}

    def visit(name, obj):
        if isinstance(obj, h5py.Dataset) and not name.startswith(("optimizer/", seeds.GROUP + "/")):
            layer = obj.parent.attrs.get("name")
            if isinstance(layer, bytes):
                layer = layer.decode()
            found[name] = (tuple(obj.shape), f"layer {layer!r}" if layer else "the model's own")

    try:
        with io.open_file(path, "rb") as handle, h5py.File(handle, "r") as weights:
            weights.visititems(visit)
    except OSError as e:
        raise ModelDirError(f"cannot read checkpoint {path} as a Keras 3 weights file ({e}); "
                            f"restore it from a backup, or train in a fresh --model-dir.") from e
    return found


def _short(error):
    """Keras' load error without the variable values it prints."""
    text = re.sub(r"Target variable: <.*?>", "", str(error), flags=re.S)
    return textwrap.shorten(" ".join(text.split()), 600, placeholder=" ...")
