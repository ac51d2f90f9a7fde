"""``--hparams key=value,...``: parsing, and applying overrides to a config.

Keys are looked up in TrainConfig, then DataConfig, then the model dict;
each value is parsed to the type of the field's current value, and an
unknown key is a ConfigError listing every valid key.
"""

import dataclasses

from estimator_keras.errors import ConfigError, UsageError, closest
from experiments.config.types import LEARNING_RATE_DECAYS, PIPELINES, DataConfig, TrainConfig


def parse_value(key, text, default, source=None):
    """``text`` parsed to the type of ``default`` (ConfigError naming ``key``,
    and ``source``, the config file it is from, if any)."""
    what = f"{source}: {key}={text!r}" if source else f"hparam {key}={text!r}"
    if isinstance(default, bool):
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{what}: expected a boolean (true/false).")
    for kind in (int, float):
        if isinstance(default, kind):
            try:
                return kind(text)
            except ValueError:
                # "64.0": tuning services send whole numbers as doubles.
                if kind is int and _whole(text):
                    return int(float(text))
                raise ConfigError(f"{what}: expected {kind.__name__} "
                                  f"(default {default!r}).") from None
    if default is None:
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
    if isinstance(default, (list, tuple)):
        return type(default)(parse_value(key, t, default[0] if default else "", source)
                             for t in text.split(":"))
    return text


def _whole(text):
    try:
        return float(text).is_integer()
    except ValueError:
        return False


def _cache_mode(key, text):
    if text.lower() == "auto":
        return "auto"
    try:
        return parse_value(key, text, False)
    except ConfigError:
        raise ConfigError(f"hparam {key}={text!r}: expected auto, true or false.") from None


# Fields whose values are not all of one type.
_PARSERS = {"cache": _cache_mode}


def parse_hparams(text):
    """'a=1,b=x' -> {'a': '1', 'b': 'x'}; UsageError on malformed items."""
    result = {}
    for item in filter(None, (t.strip() for t in (text or "").split(","))):
        if "=" not in item:
            raise UsageError(f"--hparams item {item!r} is not key=value; expected "
                             f"e.g. --hparams learning_rate=0.01,dropout=0.3.")
        key, value = item.split("=", 1)
        result[key.strip()] = value.strip()
    return result


def with_overrides(config, hparams=None, **flags):
    """A copy of ``config`` with hparams (strings), then typed flags, applied.

    Keys are looked up in TrainConfig, then DataConfig, then the model dict;
    an unknown key is a ConfigError listing every valid key.
    """
    train = dataclasses.replace(config.train)
    data = dataclasses.replace(config.data)
    model = dict(config.model)
    for key, text in (hparams or {}).items():
        for target in (train, data):
            if key in {f.name for f in dataclasses.fields(target)} and key not in (
                    "dataset", "features"):
                parse = _PARSERS.get(key)
                setattr(target, key, parse(key, text) if parse else
                        parse_value(key, text, getattr(target, key)))
                break
        else:
            if key in model:
                model[key] = parse_value(key, text, model[key])
            else:
                valid = sorted({f.name for f in dataclasses.fields(TrainConfig)}
                               | {f.name for f in dataclasses.fields(DataConfig)}
                               - {"dataset", "features"} | set(model))
                close = closest(key, valid)
                hint = f" (did you mean {close}?)" if close else ""
                raise ConfigError(f"unknown hparam {key!r}{hint} "
                                  f"for experiment {config.name!r}; valid: {', '.join(valid)}.")
    # Flags come last: they beat --hparams.
    for key, value in flags.items():
        if value is not None:
            setattr(train, key, value)
    _validate(config.name, train, data)
    return dataclasses.replace(config, train=train, data=data, model=model)


def _validate(name, train, data):
    budget = data.cache_budget_mb
    if budget is not None and not (isinstance(budget, (int, float)) and budget > 0):
        raise ConfigError(f"{name}: cache_budget_mb must be a positive number of MB; given "
                          f"{budget!r}.")
    if data.pipeline not in PIPELINES:
        raise ConfigError(f"{name}: pipeline must be one of {', '.join(PIPELINES)}; given "
                          f"{data.pipeline!r}.")
    for key in ("batch_size", "max_steps", "eval_every_steps", "log_every_steps"):
        if getattr(train, key) < 1:
            raise ConfigError(f"{name}: {key} must be a positive integer; given "
                              f"{getattr(train, key)!r}.")
    if not train.learning_rate > 0:
        raise ConfigError(f"{name}: learning_rate must be positive; given "
                          f"{train.learning_rate!r}.")
    if train.learning_rate_decay not in LEARNING_RATE_DECAYS:
        raise ConfigError(f"{name}: learning_rate_decay must be one of "
                          f"{', '.join(LEARNING_RATE_DECAYS)}; given "
                          f"{train.learning_rate_decay!r}.")
