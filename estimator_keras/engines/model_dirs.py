"""Which engine's checkpoints a model dir holds, asked of the registry: the
newest checkpoint of any engine, the engine that wrote it, and the refusal
of a model dir that an engine cannot continue.

An engine whose checkpoints are its own files (a registry entry with a
``marker``) is known from file names without TensorFlow; TensorFlow
checkpoints are attributed by asking each entry's ``claims`` in registry
order, and else to the entry that claims the rest, which imports TensorFlow.
"""

from estimator_keras import checkpoints
from estimator_keras.engines import registry
from estimator_keras.errors import ModelDirError


def _local(model_dir):
    # File-name markers read local folders only; gs:// dirs count as not.
    return bool(model_dir) and "://" not in str(model_dir)


def marked_by(model_dir):
    """The engine whose own checkpoint files are in ``model_dir`` (known
    without TensorFlow), or None."""
    if not _local(model_dir):
        return None
    for entry in registry.entries():
        if entry.marker is not None and entry.marker(model_dir):
            return entry.name
    return None


def any_checkpoint(model_dir):
    """The newest checkpoint of any engine in ``model_dir`` (an engine's own
    files first: such an engine continues a TF checkpoint beside them and
    writes its own at once), or None. Imports TensorFlow unless its own
    files are there."""
    marked = marked_by(model_dir)
    if marked is not None:
        return registry.get(marked).newest(model_dir)
    return checkpoints.tf_checkpoint(model_dir)


def checkpoint_engine(checkpoint):
    """The engine that wrote a TensorFlow checkpoint: the first entry whose
    ``claims`` accepts it, else the first that claims the rest, or None."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    reader = tf.train.load_checkpoint(checkpoint)
    for entry in registry.entries():
        if entry.claims is not None and entry.claims(reader):
            return entry.name
    return next((entry.name for entry in registry.entries() if entry.claims_the_rest), None)


def engine_of(model_dir):
    """The engine that wrote ``model_dir``'s newest checkpoint, or None
    where there is none."""
    marked = marked_by(model_dir)
    if marked is not None:
        return marked
    latest = checkpoints.tf_checkpoint(model_dir)
    return checkpoint_engine(latest) if latest else None


def check_can_continue(model_dir, engine):
    """Raises EngineMismatchError where ``model_dir``'s newest checkpoint
    (another engine's own files, or a TensorFlow checkpoint another engine
    claims) is what ``engine`` cannot continue: the writer's entry words the
    refusal. Imports TensorFlow unless an engine's own files are there."""
    marked = marked_by(model_dir)
    if marked is None:
        # Only a writer that refuses others needs the checkpoint read.
        if not any(e.refuse_model_dir for e in registry.entries() if e.claims is not None):
            return
        marked = engine_of(model_dir)
    if marked is None or marked == engine or marked in registry.get(engine).continues:
        return
    refuse = registry.get(marked).refuse_model_dir
    if refuse is not None:
        refuse(model_dir, engine)


def latest_tf_checkpoint(model_dir, engine):
    """The newest TensorFlow checkpoint in ``model_dir`` for ``engine``;
    ModelDirError where there is none, or where another engine's files
    there are what ``engine`` cannot continue."""
    check_can_continue(model_dir, engine)
    found = checkpoints.tf_checkpoint(model_dir)
    if found is None:
        raise ModelDirError(f"{model_dir} holds no checkpoint: train first "
                            f"(`python -m experiments train ... --model-dir {model_dir}`).")
    return found
