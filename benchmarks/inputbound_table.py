"""Table "inputbound": is Estimator training waiting for its input?

The same Estimator (seed CNN, seed MLP) is trained with this package's real
``input_fn`` over the TFRecords (the experiments' settings: ``cache="auto"``,
which caches Fashion-MNIST; its cache fills during each window's untimed
warm-up steps) and with a synthetic one,
``Dataset.from_tensors(one real batch).repeat()``, which costs next to
nothing per step. If the real pipeline keeps up, both run at the same
steps/s: the target is real / synthetic >= 0.95. Alternatives of the real
pipeline (InputConfig knobs, tf.data options, a completed in-memory cache)
run alongside, since a pipeline is best judged by the training it sustains.
Windows alternate between all of them, as in the training table.
"""

from benchmarks import common, output, training_table
from benchmarks.common import IMAGE

TABLE = "inputbound"
TITLE = "Estimator steps/s, real input_fn vs synthetic in-memory input_fn"
MODELS = training_table.MODELS


def synthetic_input_fn_factory(path, settings):
    """A factory of an input_fn repeating one real batch forever, with the
    dtypes and shapes the real pipeline yields (float32 images, int64 labels)."""
    images, labels = common.load_arrays(path, "train")
    batch_x = images[:settings.batch_size].astype("float32")
    batch_y = labels[:settings.batch_size]

    def factory():
        def input_fn():
            import tensorflow as tf  # pylint: disable=import-outside-toplevel

            return tf.data.Dataset.from_tensors(({IMAGE: batch_x}, batch_y)).repeat()
        return input_fn

    return factory


def dataset_input_fn_factory(make_dataset):
    """A factory of an input_fn returning ``make_dataset()``."""
    def factory():
        def input_fn():
            return make_dataset()
        return input_fn
    return factory


def variants(model_name, path, settings, knobs=True):
    from benchmarks import input_table  # pylint: disable=import-outside-toplevel

    out = [
        training_table.EstimatorVariant(
            "real", model_name, settings, training_table.real_input_fn(path, settings),
            description="make_input_fn over the TFRecords, the experiments' pipeline "
                        "(cache=auto)"),
        training_table.EstimatorVariant(
            "synthetic", model_name, settings, synthetic_input_fn_factory(path, settings),
            description="from_tensors(one batch).repeat()"),
    ]
    if not knobs:
        return out
    resolved = common.dataset_info(path, "train")
    b = settings.batch_size
    alternatives = [
        ("real cache=False", lambda: input_table.package_pipeline(path, b),
         "make_dataset with the library's default cache=False: parses every epoch"),
        ("real cycle=2,block=128",
         lambda: input_table.package_pipeline(path, b, cycle_length=2, block_length=128),
         "make_dataset(cycle_length=2, block_length=128), no cache"),
        ("real parse map sequential",
         lambda: input_table.custom_pipeline(resolved.files, resolved.schema, b,
                                             compression=resolved.compression,
                                             parse_parallel=False),
         "uncached pipeline with a sequential parse map (custom_pipeline)"),
        ("real +options max_intra_op=1",
         lambda: input_table.with_options(input_table.package_pipeline(path, b),
                                          {"threading.max_intra_op_parallelism": 1}),
         "uncached pipeline + tf.data.Options threading.max_intra_op_parallelism=1"),
    ]
    for name, make, description in alternatives:
        out.append(training_table.EstimatorVariant(
            name, model_name, settings, dataset_input_fn_factory(make),
            description=description, group="knob"))
    return out


def run(settings, path=None, models=MODELS, knobs=True):
    common.quiet_tensorflow()
    path = path or common.dataset_path(settings)
    rows, targets = [], []
    load_start = output.load_average()
    for model_name in models:
        vs = variants(model_name, path, settings, knobs)
        repeats = settings.repeats_for(5 if model_name == "seed_cnn" else 7)
        m = common.run_alternating(vs, repeats, f"{TABLE}/{model_name}", reference="synthetic")
        model_rows = common.rows_from(vs, m, reference="synthetic",
                                      unit="steps/s")
        for row in model_rows:
            row["name"] = f"{model_name} {row['name']}"
        rows.extend(model_rows)
        uncached = next((r.get("ratio") for r in model_rows
                         if r["name"].endswith("real cache=False")), None)
        targets.append(common.target(
            f"inputbound.{model_name}",
            f"{model_name}: real (experiments' pipeline, cache=auto) / synthetic input_fn",
            model_rows[0].get("ratio"), 0.95,
            why=f"uncached: {uncached:.2f}" if uncached is not None else None))
        best = max((r for r in model_rows[2:] if r.get("ratio")), key=lambda r: r["ratio"],
                   default=None)
        if best is not None:
            targets.append(common.target(
                f"inputbound.{model_name}.best_knob",
                f"{model_name}: best alternative ({best['name'].split(' ', 1)[1]}) / "
                f"synthetic (info)", best["ratio"], 0.95))
    return {"table": TABLE, "title": TITLE, "unit": "steps/s", "rows": rows,
            "columns": ["name", "median", "min", "max", "ratio", "ratio_best", "window_steps"],
            "targets": targets, "dataset": path, "load_before": load_start,
            "load_after": output.load_average(),
            "notes": ["ratio = median over windows of (rate / mean rate of the nearest "
                      "`synthetic` windows of the same model before and after it)",
                      "ratio_best = best window / best `synthetic` window"]}
