"""TensorFlow where it is installed, for the data layer's steps that run without it too.

``prepare``, ``inspect`` and ``verify`` run on an install without TensorFlow
(Keras 3 on JAX): records are framed by :mod:`estimator_keras.tfrecord_frames`
and encoded by :mod:`estimator_keras.example_codec`, remote paths go through
fsspec. Some steps still use TensorFlow when it is there (its record reader
and writer where google-crc32c is missing, its image decoders), and a few
cannot do without it (images decoded, resized or re-encoded: the stored bytes
and pixels are TensorFlow's): :func:`require` names them.

Example::

    from estimator_keras import tf_optional

    tf = tf_optional.tensorflow()      # None without TensorFlow
    tf = tf_optional.require("re-encoding images as PNG")  # or UsageError
"""

import functools
import importlib.util

from estimator_keras.errors import UsageError

INSTALL = ("pip install -e '.[cpu]' in your estimator-keras checkout (or pip install "
           "tensorflow-cpu)")


@functools.lru_cache(maxsize=None)
def tensorflow():
    """The ``tensorflow`` module, or None when it is not installed.

    A failure of the import of an installed TensorFlow (a broken install) is
    raised.
    """
    if importlib.util.find_spec("tensorflow") is None:
        return None
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    return tf


def require(what, hint=""):
    """The ``tensorflow`` module; when it is not installed, UsageError saying
    that ``what`` needs it, how to install it, then ``hint`` (a sentence)."""
    tf = tensorflow()
    if tf is None:
        raise UsageError(f"{what} needs TensorFlow, which is not installed here: "
                         f"{INSTALL}.{' ' + hint if hint else ''}")
    return tf
