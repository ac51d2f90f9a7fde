"""Exports of a Keras 3 model (the keras3 engine's), in the layout of
:mod:`estimator_keras.export`:

- ``model.keras``: Keras 3's own file; ``keras.saving.load_model(path)``
  loads it in any Keras 3 process, on any backend, without this package;
- ``model.h5``: the same model in Keras 3's HDF5 format, so that the one
  line the other engines' exports document,
  ``tf.keras.models.load_model(path, compile=False)``, loads this export
  too, in any Keras 3 process on either backend (Keras 2 cannot read its
  layer configs: it loads ``weights.h5``);
- ``weights.h5``: the weights in the legacy HDF5 layout (layer names in the
  model's order, each layer's trainable then non-trainable weights), which
  Keras 2 (``tf.keras`` 2.15, tf-keras 2.16+) loads with
  ``model.load_weights`` into the same builder's model, as Keras 3 does;
- ``saved_model/`` (or the export's root when ``flat``): the signatures
  ``serving_default`` (raw inputs keyed by the experiment's feature names;
  ``probabilities``, ``class_id`` and, with class names, ``class_name``,
  whatever the model's layers are called: :mod:`estimator_keras.signatures`)
  and ``serve_examples`` (serialized tf.train.Example strings), in plain
  TensorFlow ops;
- ``export.json``: the checkpoint, step, the signatures' inputs and outputs,
  and the metrics it came from; ``skipped`` names what was left out and why.

Without TensorFlow (the keras3 engine on JAX, fed by Grain) the SavedModel
cannot be written: the export holds the other files, says so once in the
log, and records ``skipped: {"saved_model": ...}`` in export.json;
``python -m experiments export --force`` adds it once TensorFlow is installed.

On the JAX backend the SavedModel is written by a child process on
Keras 3's TensorFlow backend from the staged ``model.keras``: ``jax2tf``
(what ``model.export`` uses there) serializes StableHLO that a TensorFlow
older than the installed JAX cannot load once the batch size is dynamic
(JAX 0.12 -> TensorFlow 2.21: "unregistered operation
'vhlo.custom_call_v2'"), and TF Serving images lag further behind.

Example::

    write_export(model, "/tmp/run/export", step=300, schema=schema,
                 features={"image": "image"}, class_names=names)
    # elsewhere, Keras 3 without this package:
    model = keras.saving.load_model("/tmp/run/export/model.keras")
    model = tf.keras.models.load_model("/tmp/run/export/model.h5", compile=False)
"""

import argparse
import json
import logging
import importlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import types

import h5py
import numpy as np

from estimator_keras import io
from estimator_keras import export as export_lib
from estimator_keras.distribute import netns
from estimator_keras.engines.keras3 import checkpoints as keras3_checkpoints
from estimator_keras.errors import ModelDirError, TensorFlowError
from estimator_keras.schema import FeatureSpec, schema_to_json
from estimator_keras.signatures import serving_signatures

MODEL_FILE = "model.keras"
H5_MODEL_FILE = "model.h5"
WEIGHTS_FILE = "weights.h5"
SAVED_MODEL_DIR = "saved_model"
# HDF5 object headers hold at most 64 KiB of attributes: longer name lists
# are split over numbered attributes, as Keras 2 reads them.
_HDF5_ATTRIBUTE_BYTES = 64000
SAVED_MODEL_TIMEOUT_SECS = 900
NO_SAVED_MODEL = ("TensorFlow is not installed (pip install tensorflow-cpu to add one; "
                  "`python -m experiments export --force` then writes it)")

logger = logging.getLogger(__name__)
_SAID = set()


def _say_once(message):
    """Exports run several times a run (best/ and the final one): once is enough."""
    if message not in _SAID:
        _SAID.add(message)
        logger.info(message)


def export_model(model_builder, model_dir, *, checkpoint=None, schema=None, features=None,
                 export_dir=None, metadata=None, class_names=None, flat=False,
                 output_activation=None):
    """:func:`estimator_keras.export.export_model` for the keras3 engine:
    restores a keras3 checkpoint (``ckpt-<step>.weights.h5``, default the
    latest in ``model_dir``) into the builder's model and writes its export
    (default ``MODEL_DIR/export``). Returns the export directory."""
    model_dir = str(model_dir)
    checkpoint = checkpoint or keras3_checkpoints.latest(model_dir)
    if checkpoint is None:
        raise ModelDirError(f"{model_dir} holds no keras3 checkpoint: train first "
                            f"(`python -m experiments train ... --engine keras3 "
                            f"--model-dir {model_dir}`).")
    model = model_builder() if callable(model_builder) and not hasattr(
        model_builder, "layers") else model_builder
    keras3_checkpoints.restore(model, checkpoint)
    return write_export(model, export_dir or io.join(model_dir, export_lib.EXPORT_DIR),
                        step=keras3_checkpoints.step_of(checkpoint), checkpoint=checkpoint,
                        schema=schema, features=features, metadata=metadata,
                        class_names=class_names, flat=flat,
                        output_activation=output_activation)


def write_export(model, export_dir, *, step=None, checkpoint=None, schema=None, features=None,
                 metadata=None, class_names=None, flat=False, output_activation=None):
    """Writes ``model.keras``, ``model.h5``, ``weights.h5``, the SavedModel and
    ``export.json`` of a Keras 3 model with its weights in place, staged and
    swapped in (see :func:`estimator_keras.export.write_staged`). Arguments
    as :func:`estimator_keras.export.export_model`'s. Returns ``export_dir``.

    Pass an uncompiled model (:func:`export_model` does): Keras 3 writes a
    compiled model's optimizer state into ``model.keras`` too."""
    import keras  # pylint: disable=import-outside-toplevel  (Keras 3 only here)

    served = serving_model(model)
    skipped = {}
    if importlib.util.find_spec("tensorflow") is None:
        skipped[SAVED_MODEL_DIR] = NO_SAVED_MODEL
        _say_once(f"no SavedModel in the export: {NO_SAVED_MODEL}")

    def write(staging):
        model_file = io.join(staging, MODEL_FILE)
        model.save(model_file)
        save_h5_model(served, io.join(staging, H5_MODEL_FILE))
        save_legacy_weights(model, io.join(staging, WEIGHTS_FILE))
        if not skipped:
            _write_any_saved_model(model, served, model_file,
                                   staging if flat else io.join(staging, SAVED_MODEL_DIR),
                                   schema, features, class_names, output_activation)
        info = {"checkpoint": checkpoint, "global_step": step,
                **export_lib.serving_info(_input_shapes(model), [t.shape for t in model.outputs],
                                          schema=schema, features=features,
                                          class_names=class_names,
                                          output_activation=output_activation),
                "features": features,
                "keras": keras.__version__, "backend": keras.backend.backend(),
                **(metadata or {})}
        if class_names:
            info["class_names"] = [str(n) for n in class_names]
        if skipped:
            info["skipped"] = skipped
        io.atomic_write(io.join(staging, export_lib.EXPORT_INFO),
                        json.dumps(info, indent=2, default=str))

    return export_lib.write_staged(export_dir, write)


def _write_any_saved_model(model, served, model_file, target, schema, features, class_names,
                           output_activation):
    """The SavedModel of ``served``: written here on the TensorFlow backend,
    else by a child process on it (see the module docstring)."""
    import keras  # pylint: disable=import-outside-toplevel

    if keras.backend.backend() == "tensorflow":
        write_saved_model(served, target, schema, features, class_names, output_activation)
    elif served is model:
        _saved_model_on_tensorflow(model_file, target, schema, features, class_names,
                                   _custom_modules(model), output_activation)
    else:
        with tempfile.TemporaryDirectory() as scratch:
            served_file = os.path.join(scratch, MODEL_FILE)
            served.save(served_file)
            _saved_model_on_tensorflow(served_file, target, schema, features,
                                       class_names, _custom_modules(served),
                                       output_activation)


def serving_model(model):
    """The model whose files serve predictions: ``model`` itself, or, for a
    functional model of the user's own ``keras.Model`` subclass (keras.io's
    ``CustomModel`` overriding ``train_step``, not ``call``), a plain
    functional model of the same layers. Prediction needs only the graph of
    layers, and the plain model loads where the user's class cannot be
    imported (``predict.py``, TensorFlow Serving, the SavedModel writer of a
    JAX run)."""
    import keras  # pylint: disable=import-outside-toplevel

    own = [c for c in type(model).__mro__
           if c is not object and c.__module__.split(".")[0] != "keras"]
    if not own or not getattr(model, "inputs", None):
        return model  # Keras' own classes, and subclassed models without a graph
    if any("call" in vars(c) for c in own):
        # The user's call is the forward pass: the graph alone would serve
        # other predictions than the model's.
        return model
    return keras.Model(model.inputs, model.outputs, name=model.name)


# -- model.h5 and weights.h5 in the legacy layouts


class _Without(logging.Filter):
    """Drops the log records whose message contains ``text``."""

    def __init__(self, text):
        super().__init__()
        self.text = text

    def filter(self, record):
        return self.text not in record.getMessage()


def save_h5_model(model, path):
    """Writes the model (architecture and weights, no optimizer) to ``path``
    with Keras 3's HDF5 saving, which ``tf.keras.models.load_model(path,
    compile=False)`` and ``keras.saving.load_model`` read back on either
    backend."""
    # Keras logs that HDF5 is a legacy format at every such save: the export
    # writes model.keras beside it, so the advice is noise in every run's log.
    quiet = _Without("considered legacy")
    absl = logging.getLogger("absl")
    absl.addFilter(quiet)
    try:
        model.save(path, include_optimizer=False)
    finally:
        absl.removeFilter(quiet)


def save_legacy_weights(model, path):
    """Writes the model's weights to ``path`` in the HDF5 layout of Keras 2's
    ``save_weights("x.h5")``: attribute ``layer_names`` (the model's layers in
    order), a group per layer with attribute ``weight_names`` and one dataset
    per weight, trainable weights first. Keras 2 and Keras 3 both load it by
    position: the n-th layer with weights gets the n-th group's values."""
    import keras  # pylint: disable=import-outside-toplevel

    with io.atomic_file(path, "wb") as f, h5py.File(f, "w") as h5:
        _set_name_list(h5, "layer_names", [layer.name for layer in model.layers])
        h5.attrs["backend"] = keras.backend.backend().encode("utf8")
        h5.attrs["keras_version"] = keras.__version__.encode("utf8")
        for layer in model.layers:
            group = h5.create_group(layer.name)
            weights = list(layer.trainable_weights) + list(layer.non_trainable_weights)
            # The path is unique in the model; a layer's own names may repeat
            # (attention's four kernels).
            names = [str(w.path) for w in weights]
            _set_name_list(group, "weight_names", names)
            for name, weight in zip(names, weights):
                group.create_dataset(name, data=keras.ops.convert_to_numpy(weight))


def _set_name_list(node, key, names):
    encoded = np.array([n.encode("utf8") for n in names], dtype=bytes)
    chunks = max(1, -(-encoded.nbytes // _HDF5_ATTRIBUTE_BYTES))
    if chunks == 1:
        node.attrs[key] = encoded
        return
    for i, part in enumerate(np.array_split(encoded, chunks)):
        node.attrs[f"{key}{i}"] = part


# -- the SavedModel


def _input_shapes(model):
    """Model input name -> its shape and dtype, as ``export.json`` reads a
    ``tf.TensorSpec``'s, without TensorFlow (Keras 3 names dtypes as it does)."""
    return {t.name: types.SimpleNamespace(shape=t.shape,
                                          dtype=types.SimpleNamespace(name=str(t.dtype)))
            for t in model.inputs}


def _input_specs(model):
    """Model input name -> ``tf.TensorSpec`` of one batch."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel  (the SavedModel's)
    return {t.name: tf.TensorSpec(shape=t.shape, dtype=tf.as_dtype(str(t.dtype)), name=t.name)
            for t in model.inputs}


def serving_functions(model, schema=None, features=None, class_names=None,
                      output_activation=None):
    """The signatures of today's exports as tf.functions over a Keras 3
    model on the TensorFlow backend (see
    :func:`estimator_keras.signatures.serving_signatures`)."""
    specs = _input_specs(model)
    input_names = [t.name for t in model.inputs]

    def call(inputs):
        values = [inputs[n] for n in input_names]
        return model(values[0] if len(values) == 1 else values, training=False)

    return serving_signatures(call, specs, [t.shape for t in model.outputs], schema=schema,
                              features=features, class_names=class_names,
                              activation=output_activation, autograph=False)


def write_saved_model(model, path, schema=None, features=None, class_names=None,
                      output_activation=None):
    """Writes the SavedModel of :func:`serving_functions` with Keras 3's
    ExportArchive (TensorFlow backend), which tracks the variables the
    signatures use."""
    import keras  # pylint: disable=import-outside-toplevel

    archive = keras.export.ExportArchive()
    archive.track(model)
    for name, function in serving_functions(model, schema, features, class_names,
                                            output_activation).items():
        function.get_concrete_function()
        archive.add_endpoint(name, function)
    archive.write_out(path, verbose=False)


def _custom_modules(model):
    """``[name, file]`` of each module defining the model's layers outside
    Keras: the child that loads ``model.keras`` imports them first so they
    are registered. The file serves modules that are not importable by
    name: the CLI loads a ``--module`` file under a name of its own."""
    modules = {type(layer).__module__ for layer in _all_layers(model)}
    # A layer class defined in a script (__main__) cannot be imported again.
    return [[m, getattr(sys.modules.get(m), "__file__", None)] for m in sorted(modules)
            if m.split(".")[0] not in ("keras", "tf_keras", "tensorflow", "__main__")]


def _import_layer_module(name, path):
    try:
        found = importlib.util.find_spec(name)
    except ImportError:
        found = None
    if found is not None or not path:
        return importlib.import_module(name)
    # Under its own name, which the model file's configs refer to.
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _all_layers(layer):
    yield layer
    for sub in getattr(layer, "layers", None) or ():
        yield from _all_layers(sub)


def _saved_model_on_tensorflow(model_file, target, schema, features, class_names, modules,
                               output_activation=None):
    """Runs ``python -m estimator_keras.engines.keras3.export`` on Keras 3's TensorFlow
    backend to write the SavedModel of ``model_file``."""
    spec = {"model": model_file, "target": target, "features": features,
            "class_names": [str(n) for n in class_names] if class_names else None,
            "schema": schema_to_json(schema) if schema is not None else None,
            "modules": modules, "output_activation": output_activation}
    # The folder that holds the package (io is one of its top-level modules).
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(io.__file__)))
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_USE_LEGACY_KERAS="0")
    # Where this process found the package and the model's own layers.
    env["PYTHONPATH"] = os.pathsep.join(
        [package_root] + [p for p in sys.path if p and os.path.isdir(p)])
    # A SIGTERM or Ctrl-C sent to the whole process group must not kill the
    # export half-way (this process saves its checkpoint once it returns, see
    # distribute/preemption.py): the child has a session of its own, holds
    # those signals from its start, and dies with this process (see _CHILD).
    with netns.stop_signals_held():
        proc = subprocess.Popen(_child_command(spec), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=SAVED_MODEL_TIMEOUT_SECS)
    except subprocess.TimeoutExpired as e:
        proc.kill()
        proc.communicate()
        raise TensorFlowError(
            f"writing the SavedModel of {model_file} on Keras 3's TensorFlow backend did "
            f"not finish within {SAVED_MODEL_TIMEOUT_SECS} s.") from e
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        # Keras' errors may quote a whole model config on one line.
        tail = "\n".join(_shortened(line) for line in stderr.strip().splitlines()[-8:])
        raise TensorFlowError(
            f"writing the SavedModel of {model_file} on Keras 3's TensorFlow backend (the "
            f"{os.environ.get('KERAS_BACKEND')} backend's own export cannot be served by "
            f"this TensorFlow) failed with exit status {proc.returncode}:\n{tail}")


# The child dies with its parent before it imports this module, and with it
# TensorFlow (seconds): a parent killed meanwhile leaves no child importing on.
_CHILD = ("import sys\n"
          "from estimator_keras.distribute import netns\n"
          "netns.die_with(int(sys.argv[1]))\n"
          "from {module} import _main\n"
          "_main(sys.argv[2:])\n")


def _child_command(spec):
    """The command line of the SavedModel writer (:func:`_main`) for ``spec``,
    a child of this process."""
    return [sys.executable, "-c", _CHILD.format(module=__name__), str(os.getpid()),
            json.dumps(spec)]


def _shortened(line, limit=400):
    return line if len(line) <= limit else f"{line[:limit]} ... ({len(line):,} characters)"


def _main(argv=None):
    parser = argparse.ArgumentParser(allow_abbrev=False, description=(
        "Writes the SavedModel of a model.keras on Keras 3's TensorFlow backend (run by "
        "write_export for models trained on another backend)."))
    parser.add_argument("spec", help="JSON: model, target, schema, features, class_names, "
                                     "modules")
    spec = json.loads(parser.parse_args(argv).spec)
    import keras  # pylint: disable=import-outside-toplevel

    for name, path in spec.get("modules") or ():
        _import_layer_module(name, path)
    schema = spec.get("schema")
    if schema is not None:
        schema = {name: FeatureSpec.from_json(name, obj) for name, obj in schema.items()}
    model = keras.saving.load_model(spec["model"], compile=False)
    write_saved_model(model, spec["target"], schema, spec.get("features"),
                      spec.get("class_names"), spec.get("output_activation"))


if __name__ == "__main__":
    _main()
