"""A dataset's shards written by an Apache Beam pipeline, then its manifest.

:func:`write_dataset` takes what :func:`estimator_keras.records.write_dataset`
takes (the sources of each split, shard counts, compression) and writes the
same dataset: every example read by its source and encoded by
:func:`~estimator_keras.records.encode_example`, so the records are the
built-in writer's, in other shards. Each split's examples go out in
interleaved chunks (chunk ``k`` holds examples ``k, k + K, k + 2K, ...``, in
a seeded order), so every shard mixes the whole split, as the built-in
writer's shuffle does; Beam's TFRecord sink decides which shard holds which
chunk. The shards are written under the dataset's ``.incomplete/`` folder
and moved into place only once every split is whole, so a failed pipeline
leaves the dataset that was there (``prepare --force``) as it was. The
manifest is written last, once, from the pipeline's counters: per shard, the
records counted in the written file.
"""

import datetime
import tempfile

import numpy as np

from estimator_keras import io
from estimator_keras import schema as schema_lib
from estimator_keras.errors import DataError, SchemaError, UsageError
from estimator_keras.manifest import (
    INCOMPLETE_DIR, SHARD_RE, SPLIT_RE, Manifest, Shard, Split, check_compression,
    check_labels, manifest_path, shard_files_in, write_manifest)
from estimator_keras.sources.beam_runs import (
    NAMESPACE, import_beam, run, runner_name, stage, staged, temp_dir)

CHUNK = 64
"""Examples a worker reads and encodes at a time."""


def _encode_chunk(chunk, source_path, schema, split, num_chunks, seed):
    """The serialized examples of one chunk of a split (see the module docstring)."""
    import apache_beam as beam  # pylint: disable=import-outside-toplevel
    from estimator_keras import records  # pylint: disable=import-outside-toplevel
    source = staged(source_path)
    indices = np.arange(chunk, len(source), num_chunks, dtype=np.int64)
    indices = np.random.default_rng([seed, chunk]).permutation(indices)
    batch = source.read(indices)
    for i in range(len(indices)):
        yield records.encode_example(schema, {name: batch[name][i] for name in schema})
    beam.metrics.Metrics.counter(NAMESPACE, f"examples/{split}").inc(len(indices))


def _count_shard(path, compression):
    """Counts the records of a written shard (a counter named after the file)."""
    import apache_beam as beam  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel
    dataset = tf.data.TFRecordDataset(path, compression or "")
    count = int(dataset.reduce(np.int64(0), lambda n, _: n + 1))
    beam.metrics.Metrics.counter(NAMESPACE, f"shard/{io.basename(path)}").inc(count)
    return path


def _checked(splits, labels):
    """(schema, labels) every split agrees on; SchemaError otherwise."""
    schema, found = None, None
    for split, source in splits.items():
        if not isinstance(split, str) or not SPLIT_RE.match(split):
            raise UsageError(f"split name {split!r} must be letters, digits, '_' or '.'.")
        if schema is None:
            schema, found = dict(source.features), getattr(source, "labels", None)
        elif dict(source.features) != schema:
            raise SchemaError(f"split {split!r} has schema "
                              f"{schema_lib.schema_to_json(source.features)}, other splits "
                              f"{schema_lib.schema_to_json(schema)}.")
        elif getattr(source, "labels", None) != found:
            raise SchemaError(f"the sources disagree on the labels: split {split!r} has "
                              f"{getattr(source, 'labels', None)}, others {found}.")
    return schema, check_labels(found if labels is None else labels, schema)


def _counters(result):
    """{counter name: value} of the pipeline's counters in :data:`NAMESPACE`."""
    from apache_beam.metrics.metric import MetricsFilter  # pylint: disable=import-outside-toplevel
    found = {}
    for counter in result.metrics().query(
            MetricsFilter().with_namespace(NAMESPACE))["counters"]:
        value = counter.committed if counter.committed is not None else counter.attempted
        found[counter.key.metric.name] = found.get(counter.key.metric.name, 0) + int(value)
    return found


def _written(splits, staging, shards, counts, output_dir):
    """{split: Split} of the shards in ``staging``, checked against the
    sources and the pipeline's counters; DataError when they disagree."""
    written = {}
    for split, source in splits.items():
        files = sorted(f for f in shard_files_in(staging)
                       if SHARD_RE.match(f).group("split") == split)
        written[split] = Split([Shard(f, counts.get(f"shard/{f}", 0),
                                      io.size(io.join(staging, f))) for f in files])
        found = (written[split].num_examples, counts.get(f"examples/{split}", 0))
        if found != (len(source), len(source)) or len(files) != shards[split]:
            raise DataError(
                f"split {split!r} of {output_dir}: the pipeline encoded {found[1]} examples "
                f"and its {len(files)} shard(s) hold {found[0]} records; the source holds "
                f"{len(source)} in {shards[split]} shard(s). The dataset that was there is "
                f"left as it was.")
    return written


def write_dataset(splits, output_dir, *, options, num_shards, compression=None, seed=0,
                  progress=True, name="", created=None, labels=None, num_workers=None,
                  scratch=None):
    """Writes every split of ``splits`` with a Beam pipeline, then the manifest.

    Arguments as for :func:`estimator_keras.records.write_dataset`, with
    ``options`` the pipeline's ``PipelineOptions`` and ``num_shards`` an int
    or a dict split -> int; ``num_workers`` is the options' business. The
    sources travel to the workers pickled in a temporary folder (under
    ``--temp_location``, else ``scratch`` or the system's). The
    directory's old shards and manifest stay until the new shards are
    complete and counted, then are replaced: unlike the built-in writer, this
    one does not keep splits it does not write.

    Returns:
      The :class:`~estimator_keras.manifest.Manifest` written.

    Raises:
      DataError: a worker failed (the pipeline's error is the cause), or the
        counts in the written shards differ from the sources'.
    """
    del progress, num_workers
    beam = import_beam()
    output_dir = str(output_dir).rstrip("/")
    compression = check_compression(compression)
    schema, labels = _checked(splits, labels)
    shards = {s: num_shards.get(s, 1) if isinstance(num_shards, dict) else int(num_shards)
              for s in splits}
    io.makedirs(output_dir)
    staging = io.join(output_dir, INCOMPLETE_DIR)
    io.rmtree(staging)
    io.makedirs(staging)
    suffix = ".tfrecord.gz" if compression == "GZIP" else ".tfrecord"
    kind = (beam.io.filesystem.CompressionTypes.GZIP if compression
            else beam.io.filesystem.CompressionTypes.UNCOMPRESSED)

    folder = temp_dir(options, scratch or tempfile.gettempdir())
    pipeline = beam.Pipeline(options=options)
    for split, source in splits.items():
        chunks = max(1, min(len(source), -(-len(source) // CHUNK)))
        _ = (pipeline
             | f"{split}/chunks" >> beam.Create(range(chunks))
             # Spreads the chunks over the workers.
             | f"{split}/spread" >> beam.Reshuffle()
             | f"{split}/encode" >> beam.FlatMap(
                 _encode_chunk, stage(source, io.join(folder, f"{split}.pickle")), schema,
                 split, chunks, seed)
             | f"{split}/write" >> beam.io.WriteToTFRecord(
                 io.join(staging, split), file_name_suffix=suffix,
                 num_shards=shards[split], shard_name_template="-SSSSS-of-NNNNN",
                 compression_type=kind)
             | f"{split}/count" >> beam.Map(_count_shard, compression))
    try:
        counts = _counters(run(pipeline, options, f"writing {output_dir} (the dataset that "
                                                  f"was there is left as it was)"))
        written = _written(splits, staging, shards, counts, output_dir)
    except Exception:
        io.rmtree(staging)
        raise
    finally:
        io.rmtree(folder)

    # The old dataset stays readable up to here; its manifest goes first, as it
    # would vouch for shards about to be replaced.
    io.remove(manifest_path(output_dir))
    for stale in shard_files_in(output_dir):
        io.remove(io.join(output_dir, stale))
    for split in written.values():
        for shard in split.shards:
            io.rename(io.join(staging, shard.file), io.join(output_dir, shard.file))
    io.rmtree(staging)
    manifest = Manifest(
        directory=output_dir, schema=schema, splits=written, compression=compression,
        name=name,
        created={"tool": "estimator-keras", "writer": "beam",
                 "runner": runner_name(options), "seed": seed, "shuffled": True,
                 "time": datetime.datetime.now(datetime.timezone.utc).isoformat(
                     timespec="microseconds"),
                 **(created or {})},
        labels=labels)
    write_manifest(manifest)
    return manifest
