"""Which input pipeline reads a run's records: tf.data or Grain.

``data.pipeline`` says "tfdata", "grain" or "auto". The engine registry's
backend entry says which pipelines feed it (:attr:`~estimator_keras.engines.registry.Backend.pipelines`);
"auto" takes Grain where it feeds the backend and TensorFlow is not
installed, else tf.data. Both serve the same batches from the same shards;
their orders differ (Grain shuffles each epoch globally), so a model dir
stores which one its order came from (:mod:`estimator_keras.order_state`).

Example::

    from estimator_keras import pipeline_choice

    name, why = pipeline_choice.choose("auto", entry.backend("jax"))
    make_input_fn = pipeline_choice.input_fn_maker(name)
"""

import importlib.util

from estimator_keras.errors import ConfigError

PIPELINES = ("tfdata", "grain", "auto")
# The module each pipeline reads with; tf.data's is TensorFlow.
_PIPELINE_MODULES = {"tfdata": "tensorflow", "grain": "grain"}


def tensorflow_installed():
    return importlib.util.find_spec("tensorflow") is not None


def tensorflow_free(backend):
    """The pipelines that feed ``backend`` (a registry
    :class:`~estimator_keras.engines.registry.Backend`) without TensorFlow,
    whether installed or not."""
    return tuple(p for p in backend.pipelines if p != "tfdata")


def installed(pipeline):
    """Whether the module ``pipeline`` reads with is installed here."""
    return importlib.util.find_spec(_PIPELINE_MODULES[pipeline]) is not None


def choose(setting, backend, engine="this engine"):
    """``(pipeline, why)``: the pipeline ``setting`` picks for ``backend`` (a
    registry :class:`~estimator_keras.engines.registry.Backend`, or None
    for an engine on TensorFlow's own Keras); ``why`` is one line.

    Raises ConfigError for a pipeline that does not feed the backend, or
    that is not installed."""
    if setting not in PIPELINES:
        raise ConfigError(f"data.pipeline must be one of {', '.join(PIPELINES)}; given "
                          f"{setting!r}.")
    feeds = backend.pipelines if backend is not None else ("tfdata",)
    on = f"{engine} on {backend.name}" if backend is not None else engine
    has_tf = tensorflow_installed()
    if setting == "auto":
        if "grain" in feeds and not has_tf:
            setting, why = "grain", "data.pipeline=auto: TensorFlow is not installed"
        else:
            why = "data.pipeline=auto"
            setting = "tfdata"
    else:
        why = f"data.pipeline={setting}"
    if setting not in feeds:
        raise ConfigError(
            f"data.pipeline={setting}: the {setting} pipeline does not feed {on}; it feeds "
            f"{', '.join(feeds)} there. Set data.pipeline to auto or {feeds[0]} (--hparams "
            f"pipeline=...), or choose a backend it feeds (the keras3 engine on "
            f"KERAS_BACKEND=jax takes both).")
    if setting == "tfdata" and not has_tf:
        raise ConfigError(
            f"data.pipeline=tfdata needs TensorFlow, which is not installed here: pip install "
            f"tensorflow-cpu, or set data.pipeline to grain or auto"
            f"{' (Grain feeds ' + on + ')' if 'grain' in feeds else ''}.")
    if setting == "grain" and not installed("grain"):
        raise ConfigError(
            f"{why} needs Grain, which is not installed here: pip install grain (it comes with "
            f"pip install -e '.[jax]'), or set data.pipeline to tfdata.")
    return setting, why


def input_fn_maker(pipeline):
    """The ``make_input_fn`` of ``pipeline`` (imported only when chosen:
    tf.data's imports TensorFlow)."""
    # pylint: disable=import-outside-toplevel
    if pipeline == "grain":
        from estimator_keras import grain_inputs
        return grain_inputs.make_input_fn
    from estimator_keras import inputs
    return inputs.make_input_fn
