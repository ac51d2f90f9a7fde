"""The keras3 engine's checkpoints: Keras 3 weights files in MODEL_DIR.

A checkpoint is ``ckpt-<step>.weights.h5``, written by Keras 3's
``Model.save_weights``: the model's weights and, for a compiled model, the
optimizer's state (its step counter and slots), so that a resumed run
continues the optimizer where it stopped. It is the same file on every
backend: a checkpoint written on TensorFlow resumes on JAX and back.

``keras3-checkpoints.json`` names the latest and every kept checkpoint,
oldest first (``{"latest": "ckpt-300.weights.h5", "all": [...]}``). Each
weights file is written under a temporary name and renamed, then the index
is replaced atomically, and only then are the checkpoints past ``keep``
deleted: a crash at any point leaves an index that names whole files.

This module imports Keras only to save and restore: a runner can ask for the
latest checkpoint and its step without loading a backend.

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
from estimator_keras.errors import ModelDirError
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
    except (ValueError, KeyError, TypeError) as e:
        raise ModelDirError(f"{path} is damaged ({e}); it should hold "
                            f'{{"latest": "{name_of(0)}", "all": [...]}}. Delete it to '
                            f"train from scratch, or restore it from a backup.") from e
    for name in names + [latest]:
        if not _NAME.match(name):
            raise ModelDirError(f"{path} names {name!r}, which is not a checkpoint "
                                f"(ckpt-<step>{SUFFIX}).")
    return {"latest": latest, "all": names}


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


def save(model, model_dir, step, keep):
    """Writes ``model`` (with its optimizer's state) as the checkpoint of
    ``step``, makes it the latest and keeps the newest ``keep``; returns its
    path."""
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
        model.save_weights(tmp)
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
    io.atomic_write(io.join(model_dir, INDEX),
                    json.dumps({"latest": name, "all": kept}, indent=1) + "\n")
    for old in dropped:
        if old != name:
            io.remove(io.join(model_dir, old))
    return path


def save_unkept(model):
    """Saves ``model`` to a temporary file and deletes it: how a process
    that keeps no checkpoint takes part in a save that is collective (Keras
    3 on several JAX processes)."""
    folder = tempfile.mkdtemp(prefix="estimator-keras-unkept-")
    try:
        model.save_weights(os.path.join(folder, name_of(0)))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def restore(model, path):
    """Loads a checkpoint into ``model``; a compiled model gets its optimizer
    state too (the optimizer is built first, or Keras would skip it).
    Returns the checkpoint's step.

    Raises:
      ModelDirError: the file does not fit the model (another architecture).
    """
    step = step_of(path)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and not optimizer.built:
        optimizer.build(model.trainable_variables)
    try:
        model.load_weights(str(path))
    except (ValueError, KeyError) as e:
        raise ModelDirError(
            f"checkpoint {path} does not fit this model's architecture (a model dir of another "
            f"model?); refusing to restore it. Keras says: {_short(e)} Use a fresh --model-dir "
            f"for a different model.") from e
    if optimizer is not None and int(optimizer.iterations.numpy()) != step:
        raise ModelDirError(
            f"checkpoint {path} holds no optimizer state of this model's optimizer "
            f"({type(optimizer).__name__}): its step counter reads "
            f"{int(optimizer.iterations.numpy())}, not {step}. Was the optimizer changed? Train "
            f"with the optimizer it was written with, or start a fresh --model-dir.")
    return step


def _short(error):
    """Keras' load error without the variable values it prints."""
    text = re.sub(r"Target variable: <.*?>", "", str(error), flags=re.S)
    return textwrap.shorten(" ".join(text.split()), 600, placeholder=" ...")
