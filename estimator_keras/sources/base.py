"""The example-source protocol's shared plumbing, and :class:`ArraySource`.

Every source follows one small protocol, which is all
:func:`estimator_keras.records.write_dataset` needs::

    source.features          # ordered {name: FeatureSpec}: the schema of its examples
    len(source)              # number of examples
    source.read(indices)     # {name: np.ndarray}, first axis len(indices), in that order

``indices`` is a 1-D integer array in any order and may repeat. Features
encoded ``png``, ``jpeg`` or ``bytes`` come back as ``dtype=object`` arrays
holding ``bytes``.

Sources are pickled into spawned worker processes, so they keep only paths
and small metadata in their state and open files lazily; reading touches only
the requested examples, so memory stays flat whatever the dataset's size.
"""

import numpy as np

from estimator_keras.errors import DataError, SchemaError, UsageError
from estimator_keras.schema import spec_for_array


def as_indices(indices, length, source):
    """Validates ``indices`` for ``source.read`` and returns them as int64."""
    idx = np.asarray(indices)
    if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise UsageError(
            f"{type(source).__name__}.read expects a 1-D array of integer indices; "
            f"got an array of dtype {idx.dtype} and shape {idx.shape}.")
    idx = idx.astype(np.int64, copy=False)
    if idx.size and (idx.min() < 0 or idx.max() >= length):
        bad = idx[(idx < 0) | (idx >= length)][0]
        raise IndexError(
            f"{type(source).__name__}.read: index {bad} is out of range; the "
            f"source holds {length} examples (valid indices 0..{length - 1}).")
    return idx


def preview(items, limit=10):
    """The first ``limit`` items joined by commas, with the total when cut."""
    items = list(items)
    shown = ", ".join(str(i) for i in items[:limit])
    return shown + (f", ... ({len(items)} in all)" if len(items) > limit else "")


class Source:
    """Shared plumbing: length, repr, and pickling without open handles.

    Subclasses set ``_num_examples`` and ``features``, and list in
    ``_TRANSIENT`` the ``__dict__`` entries (memmaps, cached grids) that are
    rebuilt lazily and must not travel in a pickle.
    """

    _TRANSIENT = ()

    def __len__(self):
        return self._num_examples

    def __getstate__(self):
        state = dict(self.__dict__)
        for key in self._TRANSIENT:
            state.pop(key, None)
        return state

    def __repr__(self):
        names = ", ".join(self.features)
        return f"<{type(self).__name__}: {len(self)} examples, features: {names}>"


class ArraySource(Source):
    """Examples held as numpy arrays whose first axis is examples.

    Args:
      arrays: dict feature name -> array; all arrays must have the same first
        axis length.
      encodings: optional dict feature name -> encoding, overriding the one
        :func:`estimator_keras.schema.spec_for_array` infers.

    Example::

        source = ArraySource({"x": np.zeros((10, 4), np.float32),
                              "y": np.arange(10)})
        source.read(np.array([3, 1]))["y"]   # array([3, 1])
    """

    def __init__(self, arrays, encodings=None):
        if not isinstance(arrays, dict) or not arrays:
            raise UsageError(
                "ArraySource expects a non-empty dict of feature name -> numpy "
                f"array; got {type(arrays).__name__}"
                f"{' (empty)' if isinstance(arrays, dict) else ''}.")
        encodings = dict(encodings or {})
        unknown = sorted(set(encodings) - set(arrays))
        if unknown:
            raise UsageError(
                f"ArraySource: encodings were given for {unknown}, which are not "
                f"among the arrays' features {sorted(arrays)}.")
        self._arrays = {name: np.asarray(a) for name, a in arrays.items()}
        self.features = {name: spec_for_array(name, a, encodings.get(name))
                         for name, a in self._arrays.items()}
        lengths = {name: a.shape[0] for name, a in self._arrays.items()}
        if len(set(lengths.values())) > 1:
            listing = ", ".join(f"{name!r}: {n}" for name, n in lengths.items())
            raise DataError(
                "ArraySource: every array must hold the same number of examples "
                f"along its first axis, but the lengths differ ({listing}).")
        self._num_examples = int(next(iter(lengths.values())))

    def read(self, indices):
        """The examples at ``indices``, as {name: array}; see the module docstring."""
        idx = as_indices(indices, len(self), self)
        out = {}
        for name, array in self._arrays.items():
            values = array[idx]
            if self.features[name].encoding in ("bytes", "png", "jpeg"):
                values = _to_bytes_objects(values, name)
            out[name] = values
        return out


def _to_bytes_objects(values, name):
    """An object array of ``bytes``: what the writer expects for byte features."""
    out = np.empty(values.shape, dtype=object)
    flat_in, flat_out = values.reshape(-1), out.reshape(-1)
    for i, v in enumerate(flat_in):
        if isinstance(v, str):
            flat_out[i] = v.encode("utf-8")
        elif isinstance(v, (bytes, bytearray, memoryview)):
            flat_out[i] = bytes(v)
        else:
            # bytes(5) would silently give five zero bytes.
            raise SchemaError(f"feature {name!r} is stored as bytes, but holds a "
                              f"{type(v).__name__} ({v!r:.50}); expected str or bytes.")
    return out
