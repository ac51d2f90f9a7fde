"""Benchmarks of estimator-keras: one module per table, run by ``python -m benchmarks``
from a checkout (the package is not installed with estimator-keras).

Tables (Fashion-MNIST, batch 128 unless said):

- ``input`` (:mod:`benchmarks.input_table`): input pipelines alone, examples/s, and
  the memory of a cached pipeline per epoch (:mod:`benchmarks.cache_memory`);
- ``training`` (:mod:`benchmarks.training_table`): steps/s of the seed CNN and MLP
  trained by an Estimator, Keras ``fit``, queue runners and ``feed_dict``;
- ``inputbound`` (:mod:`benchmarks.inputbound_table`): Estimator steps/s with the
  real input_fn vs an in-memory synthetic one;
- ``writing`` (:mod:`benchmarks.writing_table`): writing records, examples/s, MB/s
  and peak memory;
- ``beam`` (:mod:`benchmarks.beam_table`, the beam extra): ``prepare images`` by the
  built-in writer and by Apache Beam's local runner, images/s and peak memory;
- ``keras`` (:mod:`benchmarks.keras_table`, TensorFlow 2.16+ with tf-keras): the
  keras engine vs plain tf-keras and Keras 3 ``fit`` on numpy;
- ``accuracy`` (:mod:`benchmarks.accuracy_table`, slow): time to 0.91 test
  accuracy and final accuracy of fashion_mnist_cnn, project vs plain Keras, and
  the knobs that make it faster (runs in :mod:`benchmarks.accuracy_runs`);
- ``shapes`` (:mod:`benchmarks.shapes_table`, slow): shapes_unet's mean IoU and
  pixel accuracy with its default settings;
- ``cluster`` (:mod:`benchmarks.cluster_table`): one process vs chief + 1 worker,
  and the keras3 engine on JAX: one process vs 2;
- ``grain`` (:mod:`benchmarks.grain_table`): the Grain input pipeline vs tf.data on
  the same shards, alone (examples/s) and feeding the keras3 engine on JAX (steps/s);
- ``grain_accuracy`` (:mod:`benchmarks.grain_accuracy_table`, slow):
  fashion_mnist_cnn's time to 0.91 and final accuracy on JAX with Grain, under
  ``--python-jax`` (an interpreter without TensorFlow).

Plumbing: :mod:`benchmarks.common` (settings, timing, targets), :mod:`benchmarks.output`
(the machine, text tables, JSON),
:mod:`benchmarks.turns` (child processes taking turns), :mod:`benchmarks.legacy`
(queue runners, ``feed_dict``), :mod:`benchmarks.plots` (PNG plots, matplotlib),
:mod:`benchmarks.report` (Markdown), :mod:`benchmarks.engine_matrix` (which Keras
features work where).

``python -m benchmarks --tables all`` runs every table (``--quick`` for a short
version); results go to ``benchmarks/results/latest.json`` with the plots beside
it; BENCHMARKS.md at the repository root reports a full run, whose JSON is in
``benchmarks/published/``.
"""
