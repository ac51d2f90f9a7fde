"""The seed question's two old ways to feed a model, rebuilt for comparison.

- Queue runners (the seed's second answer): ``string_input_producer`` ->
  ``TFRecordReader`` -> ``parse_single_example`` -> ``shuffle_batch`` in a
  ``tf.Graph()``, run by a v1 ``Session`` with ``start_queue_runners``. They
  work only in graph mode, so everything here builds into an explicit graph.
- ``feed_dict`` (the seed question's loop): numpy batches fed into
  placeholders at every ``session.run``, the way
  ``mnist.train.next_batch`` did it (a fresh permutation each epoch, then
  consecutive slices).

Example::

    graph = tf.Graph()
    with graph.as_default():
        images, labels = queue_runner_batch(files, schema, 128)
    with QueueRunnerSession(graph) as sess:
        sess.run(images)
"""

import threading

import numpy as np

from benchmarks.common import IMAGE, LABEL

# The seed's second answer: capacity=2000, min_after_dequeue=1000, num_threads=32.
SEED_CAPACITY = 2000
SEED_MIN_AFTER_DEQUEUE = 1000
SEED_THREADS = 32


def queue_runner_batch(files, schema, batch_size, num_threads=SEED_THREADS,
                       capacity=SEED_CAPACITY, min_after_dequeue=SEED_MIN_AFTER_DEQUEUE,
                       seed=None):
    """Builds the queue-runner input in the current graph.

    Returns ``(images float32 [B, H, W, C] raw pixel values, labels int64 [B])``.
    Must be called inside ``with tf.Graph().as_default():``.
    """
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    v1 = tf.compat.v1
    spec = schema[IMAGE]
    filename_queue = v1.train.string_input_producer(list(files), shuffle=True, seed=seed)
    reader = v1.TFRecordReader()
    _, serialized = reader.read(filename_queue)
    features = v1.parse_single_example(serialized, {
        IMAGE: v1.FixedLenFeature([], tf.string),
        LABEL: v1.FixedLenFeature([], tf.int64)})
    image = tf.reshape(tf.io.decode_raw(features[IMAGE], tf.as_dtype(spec.dtype)), spec.shape)
    image = tf.cast(image, tf.float32)
    images, labels = v1.train.shuffle_batch(
        [image, features[LABEL]], batch_size=batch_size, capacity=capacity,
        min_after_dequeue=min_after_dequeue, num_threads=num_threads, seed=seed)
    return images, labels


class QueueRunnerSession:
    """A v1 Session over ``graph`` with its queue runners started; on exit
    the coordinator stops them (closing the queues wakes blocked threads)
    and the session closes, so nothing keeps reading in the background.

    ``init_ops`` run first (variable initializers); the graph is finalized
    by the caller or not at all.
    """

    def __init__(self, graph, init_ops=(), config=None, join_timeout=10.0):
        self.graph, self.init_ops, self.config = graph, list(init_ops), config
        self.join_timeout = join_timeout
        self.session = self.coord = self.threads = None

    def __enter__(self):
        import tensorflow as tf  # pylint: disable=import-outside-toplevel

        v1 = tf.compat.v1
        self.session = v1.Session(graph=self.graph, config=self.config)
        for op in self.init_ops:
            self.session.run(op)
        self.coord = v1.train.Coordinator()
        with self.graph.as_default():
            self.threads = v1.train.start_queue_runners(sess=self.session, coord=self.coord)
        return self.session

    def __exit__(self, *exc):
        self.coord.request_stop()
        # The runners close their queues on stop, so blocked enqueues return.
        self.coord.join(self.threads, stop_grace_period_secs=self.join_timeout,
                        ignore_live_threads=True)
        self.session.close()
        return False


class NumpyBatcher:
    """``next_batch()`` like the seed's ``mnist.train.next_batch``: a new
    random permutation of the arrays each epoch, then consecutive slices."""

    def __init__(self, images, labels, batch_size, seed=0):
        self.images, self.labels = images, labels
        self.batch_size = int(batch_size)
        self.rng = np.random.default_rng(seed)
        self._epoch_images = self._epoch_labels = None
        self._pos = len(labels)
        self._lock = threading.Lock()

    def next_batch(self):
        with self._lock:
            if self._pos + self.batch_size > len(self.labels):
                order = self.rng.permutation(len(self.labels))
                self._epoch_images = self.images[order]
                self._epoch_labels = self.labels[order]
                self._pos = 0
            start, self._pos = self._pos, self._pos + self.batch_size
            return (self._epoch_images[start:self._pos],
                    self._epoch_labels[start:self._pos])


def placeholders(schema):
    """The seed's placeholders, for raw float32 images and int64 labels."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    spec = schema[IMAGE]
    images = tf.compat.v1.placeholder(tf.float32, shape=(None, *spec.shape), name="images")
    labels = tf.compat.v1.placeholder(tf.int64, shape=(None,), name="labels")
    return images, labels


def train_op_for(build_model, images, labels, learning_rate=1e-3):
    """Keras layers in the current v1 graph on ``images``, an Adam step on the
    mean sparse cross-entropy: what the seed's answers did with Keras on
    tensors. Returns ``(train_op, loss, model)``."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    model = build_model({})
    probabilities = model(images, training=True)
    loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, probabilities))
    train_op = tf.compat.v1.train.AdamOptimizer(learning_rate).minimize(loss)
    return train_op, loss, model
