"""estimator-keras: fast, boring Keras training on TFRecord data.

The public API:

- data: :func:`write_records`, :func:`write_dataset`, :func:`load_manifest`,
  :func:`read_schema`, :func:`inspect`;
- input: :func:`make_dataset`, :func:`make_input_fn`, :class:`InputConfig`;
- training: :func:`to_estimator`, :func:`train_and_evaluate`,
  :func:`legacy_optimizer`, :class:`EarlyStopping`;
- export: :func:`export_model`, :class:`BestExporter`.

TensorFlow is imported on first use, not by ``import estimator_keras``.
"""

__version__ = "0.1.0"

from estimator_keras.errors import (  # noqa: F401
    ClusterConfigError, ConfigError, CorruptRecordError, DataError, EstimatorKerasError,
    ModelDirError, NumericalError, SchemaError, UsageError)
from estimator_keras.estimator import (  # noqa: F401
    EarlyStopping, legacy_optimizer, to_estimator, train_and_evaluate)
from estimator_keras.export import BestExporter, export_model  # noqa: F401
from estimator_keras.inputs import InputConfig, make_dataset, make_input_fn  # noqa: F401
from estimator_keras.records import (  # noqa: F401
    inspect, load_manifest, write_dataset, write_records)
from estimator_keras.schema import FeatureSpec  # noqa: F401


def read_schema(path_or_pattern, split="train"):
    """The schema (feature name -> FeatureSpec) of a dataset directory or glob."""
    from estimator_keras.records import resolve  # pylint: disable=import-outside-toplevel
    return resolve(path_or_pattern, split, check_sizes=False).schema
