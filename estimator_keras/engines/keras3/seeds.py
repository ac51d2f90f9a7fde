"""The random layers' seed states in a keras3 checkpoint.

Keras 3's random layers (``Dropout``, ``GaussianNoise``, ``RandomFlip``...)
draw from a ``keras.random.SeedGenerator``, whose state (its seed and a
counter) is a Keras variable: among ``model.variables``, but not among the
``model.weights`` that ``save_weights`` writes. Without it a resumed run's
dropout masks would start their sequence over. A checkpoint holds these
states too, in a group of its own (:data:`GROUP`) of the same weights file,
one dataset per state in the order of ``model.variables`` (the owning
layer's name as an attribute, for messages), written before the file is
renamed into place: atomically with the weights. Keras' ``load_weights``
reads past the group.

On JAX, ``fit`` trains on copies of the variables; a callback's
``self.model`` copies them back, seed states included (they are among the
model's non-trainable variables), and the engine saves from there.

This module imports Keras and h5py only when it saves or restores.

Example::

    save_weights(model, "/tmp/run/ckpt-300.weights.h5")
    model.load_weights(path)
    missed = restore(model, path)   # [] once every state is back
"""

import os
import shutil
import tempfile

from estimator_keras import io

GROUP = "seed_states"


def states(model):
    """(layer name, variable) of each random layer's seed state in
    ``model``, in the order of ``model.variables``. Keras names its
    ``variables`` "all layer state, including random seeds" and its
    ``weights`` the same "excluding random seeds"; a state is named by the
    innermost layer (of ``layers``, recursively) that holds it."""
    weights = {id(v) for v in model.weights}
    extra = [v for v in model.variables if id(v) not in weights]
    owner = {}
    pending = [model]
    while pending:
        layer = pending.pop(0)
        for variable in getattr(layer, "variables", ()):
            owner[id(variable)] = layer.name
        pending.extend(getattr(layer, "layers", ()))
    return [(owner.get(id(v), model.name), v) for v in extra]


def save_weights(model, path):
    """``model.save_weights(path)``, with the seed states in the same file."""
    found = states(model)
    if not found:
        model.save_weights(path)
        return
    if not io.is_remote(path):
        _write(model, path, found)
        return
    folder = tempfile.mkdtemp(prefix="estimator-keras-ckpt-")
    try:
        local = os.path.join(folder, io.basename(path))
        _write(model, local, found)
        io.copy_file(local, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _write(model, path, found):
    import h5py  # pylint: disable=import-outside-toplevel  (a dependency of Keras 3)
    import keras  # pylint: disable=import-outside-toplevel

    model.save_weights(path)
    with h5py.File(path, "a") as weights:
        group = weights.create_group(GROUP)
        for index, (layer, variable) in enumerate(found):
            data = group.create_dataset(str(index), data=keras.ops.convert_to_numpy(variable))
            data.attrs["layer"] = layer


def restore(model, path):
    """Assigns the seed states that the checkpoint ``path`` holds to
    ``model``'s random layers (after ``load_weights``); returns the names of
    the layers it could not (the file holds none, or not as many, or of
    other shapes: they keep the state they were built with), [] when every
    state is back or the model has none."""
    found = states(model)
    if not found:
        return []
    import h5py  # pylint: disable=import-outside-toplevel

    with io.open_file(path, "rb") as handle, h5py.File(handle, "r") as weights:
        group = weights.get(GROUP)
        values = [group[str(i)][()] for i in range(len(group))] if group is not None else []
    if [tuple(v.shape) for v in values] != [tuple(v.shape) for _, v in found]:
        return [layer for layer, _ in found]
    for (_, variable), value in zip(found, values):
        # The seed dtype is the backend's (int64 on TensorFlow, uint32 on JAX).
        variable.assign(value.astype(variable.dtype))
    return []
