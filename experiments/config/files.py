"""Config files (``--config FILE``, YAML or JSON) and the record of a run's
configuration in ``MODEL_DIR/config.yaml``.

A config file has up to three sections named like the dataclasses:
``data`` (:class:`~experiments.config.types.DataConfig`), ``train``
(:class:`~experiments.config.types.TrainConfig`) and ``model`` (the experiment's
model hyperparameters), and may set ``loss``, ``best_metric`` and
``higher_is_better``; the output of ``show`` is a valid config file::

    data:
      dataset: flowers
      cache: auto
    train:
      batch_size: 64
      learning_rate: 3e-4
    model:
      dropout: 0.4

Precedence: the experiment's defaults < the config file < ``--hparams`` <
flags (a flag and ``--hparams`` that disagree are refused:
:func:`experiments.commands.common.check_flags_agree`). Every run writes its
resolved configuration, and what the data said about itself, to
``MODEL_DIR/config.yaml``; a rerun on that model dir whose model or data
settings differ is refused, naming the keys (training settings such as
``max_steps`` may change between runs).
"""

import dataclasses
import typing

import yaml

from estimator_keras import io
from estimator_keras.engines import model_dirs
from estimator_keras.errors import ConfigError, ModelDirError, UsageError
from experiments.config import hparams
from experiments.config.data_info import DataInfo
from experiments.config.types import DataConfig, TrainConfig

RUN_CONFIG = "config.yaml"
SECTIONS = {"data": DataConfig, "train": TrainConfig}
# Top-level fields of ExperimentConfig a file may set (name and description
# only say which experiment it was written for).
SCALARS = ("loss", "best_metric", "higher_is_better")
LABELS = ("name", "description")
VALID_KEYS = ("data", "train", "model") + SCALARS + LABELS
# What makes a model dir's checkpoints what they are.
IDENTITY = ("model", "loss", "data.dataset", "data.features", "data.label", "data_info")


def load(path):
    """The sections of a config file (local or gs://), checked for shape."""
    try:
        text = io.read_text(path)
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--config {path}: cannot read it ({e}).") from e
    except Exception as e:  # pylint: disable=broad-except  (tf.io.gfile's errors for gs://)
        raise UsageError(f"--config {path}: cannot read it ({e}).") from e
    try:
        obj = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"--config {path} is not valid YAML or JSON: "
                          f"{' '.join(str(e).split())}") from e
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        raise ConfigError(f"--config {path} must hold a mapping with sections data, train "
                          f"and model; it holds a {type(obj).__name__}.")
    unknown = sorted(str(k) for k in obj if k not in VALID_KEYS)
    if unknown:
        raise ConfigError(f"--config {path}: unknown section(s) {', '.join(unknown)}; valid: "
                          f"{', '.join(VALID_KEYS)}.")
    for name in ("data", "train", "model"):
        section = obj.get(name)
        if section is not None and not isinstance(section, dict):
            raise ConfigError(f"--config {path}: section {name!r} must be a mapping of "
                              f"field: value; it is a {type(section).__name__}.")
    return {k: (v or {}) if k in SECTIONS or k == "model" else v for k, v in obj.items()}


def _typed(source, where, key, value, default, annotation=None):
    """``value`` checked against (or, for text, parsed to) the type of
    ``default``; a ConfigError names ``source`` (the file) and the key."""
    name = f"{where}.{key}" if where else key
    texts = isinstance(default, str) or default is None or str in typing.get_args(annotation)
    if isinstance(value, str) and not texts:
        return hparams.parse_value(name, value, default, source=source)
    if default is None or value is None:
        return value
    if isinstance(default, bool) or isinstance(value, bool):
        ok = isinstance(value, bool) and isinstance(default, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float))
        value = float(value) if ok else value
    else:
        ok = isinstance(value, type(default))
    if not ok and annotation is not None and typing.get_origin(annotation) is typing.Union:
        ok = any(isinstance(value, t) for t in typing.get_args(annotation) if t is not type(None))
    if not ok:
        raise ConfigError(f"{source}: {name}: expected {type(default).__name__} like the "
                          f"default {default!r}; given {value!r} ({type(value).__name__}).")
    return value


def apply(config, sections, source="--config"):
    """A copy of ``config`` with a config file's sections applied."""
    if sections.get("name") not in (None, config.name):
        raise ConfigError(f"{source} was written for experiment {sections['name']!r}, not "
                          f"{config.name!r}; change its name: or leave it out.")
    annotations = {f.name: f.type for f in dataclasses.fields(config)}
    replaced = {key: _typed(source, "", key, sections[key], getattr(config, key),
                            annotations[key])
                for key in SCALARS if key in sections}
    for name, cls in SECTIONS.items():
        values = sections.get(name) or {}
        current = getattr(config, name)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in values if k not in fields)
        if unknown:
            raise ConfigError(f"{source}: unknown key(s) {', '.join(unknown)} in section "
                              f"{name!r}; valid: {', '.join(sorted(fields))}.")
        replaced[name] = dataclasses.replace(current, **{
            key: _typed(source, name, key, value, getattr(current, key), fields[key].type)
            for key, value in values.items()})
    model = dict(config.model)
    for key, value in (sections.get("model") or {}).items():
        if key not in model:
            raise ConfigError(f"{source}: unknown key {key!r} in section 'model' of experiment "
                              f"{config.name!r}; valid: {', '.join(sorted(model)) or 'none'}.")
        model[key] = _typed(source, "model", key, value, model[key])
    return dataclasses.replace(config, model=model, **replaced)


def to_yaml(config):
    """The resolved configuration as YAML (``python -m experiments show``)."""
    return yaml.safe_dump(dataclasses.asdict(config), sort_keys=False, default_flow_style=False)


def record(config, dataset_path, data):
    """What ``MODEL_DIR/config.yaml`` holds for a run."""
    return {**dataclasses.asdict(config), "dataset_path": str(dataset_path),
            "data_info": data.to_dict() if data is not None else None}


def _flatten(obj, prefix=""):
    out = {}
    for key, value in (obj or {}).items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and key in ("data", "model"):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out


def differences(before, after):
    """``key: before -> after`` for every identity key that differs."""
    old, new = _flatten(before), _flatten(after)
    keys = sorted(k for k in set(old) | set(new) if any(
        k == i or k.startswith(i + ".") for i in IDENTITY))
    return [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys if old.get(k) != new.get(k)]


def changed_settings(model_dir, config, dataset_path, data):
    """``key: before -> after`` for each model or data setting this run
    changes in a model dir that has checkpoints of any engine (empty
    otherwise)."""
    path = io.join(model_dir, RUN_CONFIG)
    if not io.exists(path) or model_dirs.any_checkpoint(model_dir) is None:
        return []
    try:
        before = yaml.safe_load(io.read_text(path)) or {}
    except yaml.YAMLError as e:
        raise ModelDirError(f"{path} is not valid YAML ({e}); move it aside to train on "
                            f"in this model dir.") from e
    return differences(before, record(config, dataset_path, data))


class OtherRunError(ModelDirError):
    """A model dir holding the checkpoints of a run with other model or data
    settings. Its message is three short lines (what, why, what to do),
    which the command line keeps as lines."""

    keep_lines = True


def refusal(model_dir, changed, architecture=False):
    """The :class:`OtherRunError` that refuses a model dir trained with
    other settings (``changed``, as :func:`changed_settings` lists them);
    ``architecture``: its checkpoints do not fit this model either."""
    path = io.join(model_dir, RUN_CONFIG)
    try:
        name = (yaml.safe_load(io.read_text(path)) or {}).get("name")
    except (OSError, yaml.YAMLError, AttributeError):
        name = None
    # One or two changes with their values; more by name, the file has them all.
    shown = "; ".join(changed) if len(changed) <= 2 else ", ".join(
        c.split(":", 1)[0] for c in changed[:3])
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return OtherRunError(
        f"{model_dir} holds the checkpoints of another run{f' ({name})' if name else ''}"
        f"{', which do not fit this model' if architecture else ''}.\n"
        f"Its model or data settings differ: {shown}{more} (see {path}).\n"
        f"Use another --model-dir for this run, or the settings recorded there to continue "
        f"that one.")


def write(model_dir, config, dataset_path, data):
    """Records this run's configuration in ``MODEL_DIR/config.yaml``."""
    io.makedirs(model_dir)
    io.atomic_write(io.join(model_dir, RUN_CONFIG),
                    yaml.safe_dump(record(config, dataset_path, data), sort_keys=False,
                                   default_flow_style=False))


def recorded_data_info(model_dir):
    """The DataInfo a model dir was trained on, or None."""
    path = io.join(model_dir, RUN_CONFIG)
    if not io.exists(path):
        return None
    try:
        info = (yaml.safe_load(io.read_text(path)) or {}).get("data_info")
    except yaml.YAMLError:
        return None
    return DataInfo.from_dict(info) if isinstance(info, dict) else None
