"""``export``: a model dir's latest checkpoint as the files a user loads."""

from estimator_keras import io
from experiments.commands.common import (data_dir, experiment_config, model_dirs,
                                         tensorflow_module)


EXPORT_FILES = (("model.keras", "Keras 3 model, keras.saving.load_model(path)"),
                ("model.h5", "Keras model, load_model(path, compile=False)"),
                ("weights.h5", "weights only"),
                ("saved_model", "SavedModel"))


def print_export(export_dir):
    if export_dir:
        from estimator_keras import export as export_lib  # pylint: disable=import-outside-toplevel
        # The model files that are there: model.keras is the keras3 engine's
        # alone, and a keras3 export of another version may lack model.h5;
        # export.json names what was skipped (the SavedModel, without TensorFlow).
        skipped = (export_lib.read_export_info(export_dir) or {}).get("skipped") or {}
        found = [(name, what) for name, what in EXPORT_FILES if name not in skipped and (
            name in ("weights.h5", "saved_model") or io.exists(io.join(export_dir, name)))]
        for k, (name, what) in enumerate(found):
            label = "exported:" if k == 0 else ""
            print(f"{label:9} {io.join(export_dir, name)}  ({what})")


def run(args):
    train = tensorflow_module("experiments.training.run")
    experiment, config = experiment_config(args)
    out, written = train.export(experiment, config, model_dir=model_dirs(args)[0],
                                data_dir=data_dir(args), export_dir=args.export_dir,
                                force=args.force)
    if not written:
        print(f"{out} already holds the export of the latest checkpoint: left as it is "
              f"(--force writes it again)")
    print_export(out)
    return 0
