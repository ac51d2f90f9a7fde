"""estimator-keras: fast, boring Keras training on TFRecord data.

The public API:

- data: :func:`write_records`, :func:`write_dataset`, :func:`load_manifest`,
  :func:`read_schema`, :func:`inspect`;
- input: :func:`make_dataset`, :func:`make_input_fn`, :class:`InputConfig`;
- training with the estimator engine: :func:`to_estimator`,
  :func:`train_and_evaluate`, :func:`legacy_optimizer`, :class:`EarlyStopping`;
- training with the keras engine (``Model.fit``; TensorFlow 2.16+ too):
  :func:`fit_and_evaluate`; choosing one: :func:`resolve_engine`;
- export: :func:`export_model`, :class:`BestExporter`.

TensorFlow is imported on first use, not by ``import estimator_keras``.
Importing this package before TensorFlow sets ``TF_USE_LEGACY_KERAS=1``
when ``tf-keras`` is installed and the variable is unset, so that on
TensorFlow 2.16+ ``tf.keras`` is Keras 2, which both engines need.
"""

__version__ = "0.2.0"

from estimator_keras import engines as _engines

_engines.prefer_legacy_keras()

# pylint: disable=wrong-import-position
from estimator_keras.engines import resolve_engine  # noqa: F401,E402

from estimator_keras.errors import (  # noqa: F401,E402
    ClusterConfigError, ConfigError, CorruptRecordError, DataError, EstimatorKerasError,
    ModelDirError, NumericalError, SchemaError, UsageError)
from estimator_keras.estimator import (  # noqa: F401
    EarlyStopping, legacy_optimizer, to_estimator, train_and_evaluate)
from estimator_keras.export import BestExporter, export_model  # noqa: F401
from estimator_keras.fit import fit_and_evaluate  # noqa: F401
from estimator_keras.inputs import InputConfig, make_dataset, make_input_fn  # noqa: F401
from estimator_keras.records import (  # noqa: F401
    inspect, load_manifest, write_dataset, write_records)
from estimator_keras.schema import FeatureSpec  # noqa: F401


def read_schema(path_or_pattern, split="train"):
    """The schema (feature name -> FeatureSpec) of a dataset directory or glob."""
    from estimator_keras.records import resolve  # pylint: disable=import-outside-toplevel
    return resolve(path_or_pattern, split, check_sizes=False).schema
