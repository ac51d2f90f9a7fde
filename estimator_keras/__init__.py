"""estimator-keras: fast, boring Keras training on TFRecord data.

The public API:

- data: :func:`write_records`, :func:`write_dataset`, :func:`load_manifest`,
  :func:`read_schema`, :func:`inspect`, :class:`FeatureSpec`;
- input: :func:`make_dataset`, :func:`make_input_fn`, :class:`InputConfig`;
- training with the estimator engine: :func:`to_estimator`,
  :func:`train_and_evaluate`, :func:`legacy_optimizer`, :class:`EarlyStopping`;
- training with the keras engine (``Model.fit``; TensorFlow 2.16+ too):
  :func:`fit_and_evaluate`; choosing one: :func:`resolve_engine`;
- export: :func:`export_model`, :class:`BestExporter`;
- errors: :class:`EstimatorKerasError` and its subclasses.

``import estimator_keras`` loads no TensorFlow: each name is imported from
its module on first use. Importing this package before TensorFlow sets
``TF_USE_LEGACY_KERAS=1`` when ``tf-keras`` is installed and the variable is
unset, so that on TensorFlow 2.16+ ``tf.keras`` is Keras 2, which the
estimator and keras engines need; for the keras3 engine (Keras 3), call
``estimator_keras.engines.prepare_keras("keras3")`` before importing
TensorFlow: the engine's choice wins over that default.
"""

import importlib

from estimator_keras.engines import prefer_legacy_keras

__version__ = "0.3.0"

prefer_legacy_keras()

# Public name -> the module that defines it.
_EXPORTS = {
    "resolve_engine": "estimator_keras.engines",
    "EarlyStopping": "estimator_keras.engines.base",
    "legacy_optimizer": "estimator_keras.engines.optimizers",
    "to_estimator": "estimator_keras.engines.estimator.engine",
    "train_and_evaluate": "estimator_keras.engines.estimator.engine",
    "BestExporter": "estimator_keras.engines.estimator.engine",
    "fit_and_evaluate": "estimator_keras.engines.keras.engine",
    "export_model": "estimator_keras.export",
    "InputConfig": "estimator_keras.inputs",
    "make_dataset": "estimator_keras.inputs",
    "make_input_fn": "estimator_keras.inputs",
    "load_manifest": "estimator_keras.manifest",
    "write_dataset": "estimator_keras.records",
    "write_records": "estimator_keras.records",
    "read_schema": "estimator_keras.records",
    "inspect": "estimator_keras.verify",
    "FeatureSpec": "estimator_keras.schema",
    **{name: "estimator_keras.errors" for name in (
        "EstimatorKerasError", "UsageError", "ConfigError", "ClusterConfigError",
        "DataError", "SchemaError", "CorruptRecordError", "ModelDirError", "EngineMismatchError",
        "NumericalError", "CloudError")},
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'estimator_keras' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
