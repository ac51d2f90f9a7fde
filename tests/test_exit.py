"""A run's process ends soon after its last line.

What can hold it: deleting a ``tf.data`` iterator cancels the autotuning
thread that TensorFlow starts for it, and that thread can wake up before the
cancellation shows and sleep out the rest of its optimization period, which
doubles up to a minute as the iterator ages. Keras keeps its training
iterator in a reference cycle, so a garbage collection deletes it, often the
interpreter's last one after "done in". The pipelines ``make_dataset``
builds run without that thread.
"""

import time

from estimator_keras.inputs import make_dataset

# Seconds a deletion may take; a held one waits for its thread's next
# optimization, mostly seconds away after AGE_SECS (up to a minute in a run).
DELETE_SECS = 1.0
# How long the iterators run before they are deleted: the autotuning period
# (from 10 ms, doubled after each optimization) is then over a second.
AGE_SECS = 2.8


def test_pipeline_iterators_are_deleted_at_once(tiny_dataset):
    # Whether the autotuning thread misses its wake-up is a race, lost most
    # often while other pipelines' threads keep the cores busy: four dozen
    # iterators, cached and not, training and evaluation, read in turn until
    # they are old, and each deleted just after its last batch.
    directory, _ = tiny_dataset(n=64, num_shards=4)
    iterators = [iter(make_dataset(directory, 8, training=training, split="train",
                                   features=["vec"], label="id", cache=cache, seed=1))
                 for cache in (False, True) for training in (True, False) * 12]
    end = time.monotonic() + AGE_SECS
    while time.monotonic() < end:
        for iterator in iterators:
            next(iterator, None)
    took = []
    while iterators:
        iterator = iterators.pop()
        for _ in range(3):
            next(iterator, None)
        start = time.monotonic()
        del iterator
        took.append(round(time.monotonic() - start, 2))
        # The first held deletion decides; the next ones would wait longer.
        assert took[-1] < DELETE_SECS, f"seconds each deletion took: {took}"
