"""Benchmarks of estimator-keras: one module per table, run by ``python -m benchmarks``.

Tables (Fashion-MNIST, batch 128):

- ``input`` (:mod:`benchmarks.input_table`): input pipelines alone, examples/s;
- ``training`` (:mod:`benchmarks.training_table`): steps/s of the seed CNN and MLP
  trained by an Estimator, Keras ``fit``, queue runners and ``feed_dict``;
- ``inputbound`` (:mod:`benchmarks.inputbound_table`): Estimator steps/s with the
  real input_fn vs an in-memory synthetic one;
- ``writing`` (:mod:`benchmarks.writing_table`): writing records, examples/s, MB/s
  and peak memory;
- ``accuracy`` (:mod:`benchmarks.accuracy_table`, slow): time to accuracy and final
  accuracy, Estimator vs Keras ``fit``.

Results go to ``benchmarks/results/latest.json``; BENCHMARKS.md at the
repository root reports a full run.
"""
