"""The loss of an experiment: a Keras loss name, or a mapping of that name
and the settings of Keras' own loss class::

    loss: sparse_categorical_crossentropy
    loss: {name: sparse_categorical_crossentropy, from_logits: true}
    loss: {name: categorical_crossentropy, label_smoothing: 0.1}

A name passes to ``compile`` unchanged; a mapping becomes an instance of
the loss class of the model's own Keras (``SparseCategoricalCrossentropy``
for ``sparse_categorical_crossentropy``), its keys checked against that
class's constructor. :func:`check_logits` stops a model whose last layer
outputs logits (a linear activation) from training under a loss that
expects probabilities; :func:`output_activation` is what an export applies
to a logits model's output so that it serves probabilities.
"""

import importlib
import inspect

from estimator_keras.errors import ConfigError

# Losses with from_logits whose probabilities are a softmax over the last axis;
# the others (binary_crossentropy, binary_focal_crossentropy) take a sigmoid.
_SOFTMAX_LOSSES = ("categoricalcrossentropy", "sparsecategoricalcrossentropy",
                   "categoricalfocalcrossentropy")
EXAMPLE = "loss: {name: sparse_categorical_crossentropy, from_logits: true}"


def loss_name(loss):
    """The Keras name of a loss setting (a name or a mapping with ``name``)."""
    return loss.get("name") if isinstance(loss, dict) else loss


def settings(loss):
    """The constructor settings of a loss setting ({} for a name)."""
    return {k: v for k, v in loss.items() if k != "name"} if isinstance(loss, dict) else {}


def _squash(name):
    return str(name).replace("_", "").lower()


def loss_class(name, losses_module):
    """The loss class of ``losses_module`` (``keras.losses``) that ``name``
    (``sparse_categorical_crossentropy`` or ``SparseCategoricalCrossentropy``)
    names, or None."""
    base = getattr(losses_module, "Loss", None)
    for attr in dir(losses_module):
        cls = getattr(losses_module, attr)
        if (inspect.isclass(cls) and base is not None and issubclass(cls, base)
                and cls is not base and _squash(attr) == _squash(name)):
            return cls
    return None


def keras_module(model):
    """The Keras package (``keras`` or ``tf_keras``) ``model`` was built with."""
    for cls in type(model).__mro__:
        package = importlib.import_module(cls.__module__.split(".")[0])
        # The first class from a Keras package: the user's own subclasses come first.
        if hasattr(package, "losses") and hasattr(package, "Model"):
            return package
    # pylint: disable-next=import-outside-toplevel
    from estimator_keras.engines.keras_setup import keras_api
    return keras_api()


def _parameters(cls):
    return [p for p in inspect.signature(cls.__init__).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def check_loss(loss, losses_module):
    """Raises ConfigError, naming the config key, when ``loss`` is neither a
    name nor a mapping that ``losses_module``'s loss class takes."""
    if isinstance(loss, str):
        return
    if not isinstance(loss, dict) or not isinstance(loss.get("name"), str):
        raise ConfigError(
            f"loss: expected a Keras loss name (sparse_categorical_crossentropy) or a mapping "
            f"of the name and the loss class's settings ({EXAMPLE}); given {loss!r}.")
    cls = loss_class(loss["name"], losses_module)
    if cls is None:
        raise ConfigError(
            f"loss.name: {loss['name']!r} names no loss class of "
            f"{losses_module.__name__} (settings need one, e.g. "
            f"sparse_categorical_crossentropy for SparseCategoricalCrossentropy); give the "
            f"loss as a plain name to use a loss function without settings.")
    known = [p.name for p in _parameters(cls)]
    unknown = sorted(str(k) for k in settings(loss) if k not in known)
    if unknown:
        raise ConfigError(
            f"loss.{unknown[0]}: {cls.__name__} of {losses_module.__name__} takes no setting "
            f"{unknown[0]!r}; it takes {', '.join(known)}.")


def keras_loss(loss, model):
    """What ``compile(loss=...)`` takes for ``model``: a name as it is, a
    mapping as an instance of the loss class of the model's Keras."""
    if not isinstance(loss, dict):
        return loss
    module = keras_module(model).losses
    check_loss(loss, module)
    return loss_class(loss["name"], module)(**settings(loss))


def from_logits(loss):
    """Whether the loss setting says the model outputs logits."""
    return bool(settings(loss).get("from_logits"))


def output_activation(loss):
    """"softmax" or "sigmoid": what turns a logits model's output into
    probabilities under ``loss``; None when the model outputs them itself."""
    if not from_logits(loss):
        return None
    return "softmax" if _squash(loss_name(loss)) in _SOFTMAX_LOSSES else "sigmoid"


def _outputs(model):
    """A model's output tensors; none for a model whose outputs exist only
    once it is called (a subclassed model): there is no last layer to read."""
    try:
        return list(model.outputs or [])
    except (AttributeError, ValueError):
        return []


def _output_layer(model):
    names = getattr(model, "output_names", None) or []
    if len(names) == 1:
        try:
            return model.get_layer(names[0])
        except ValueError:
            pass
    layers = getattr(model, "layers", None) or []
    return layers[-1] if layers else None


def _activation_name(activation):
    return getattr(activation, "__name__", None) or str(activation)


def check_logits(model, loss):
    """Raises ConfigError before training when ``model``'s last layer has a
    linear activation (it outputs logits) and ``loss`` expects probabilities:
    a loss class with ``from_logits`` that is not set."""
    module = keras_module(model)
    check_loss(loss, module.losses)
    cls = loss_class(loss_name(loss), module.losses)
    if cls is None or "from_logits" not in [p.name for p in _parameters(cls)]:
        return
    if from_logits(loss) or len(_outputs(model)) != 1:
        return
    layer = _output_layer(model)
    activation = getattr(layer, "activation", None)
    if activation is None or _activation_name(activation) != "linear":
        return
    name = loss_name(loss)
    wanted = "softmax" if _squash(name) in _SOFTMAX_LOSSES else "sigmoid"
    raise ConfigError(
        f"the model's last layer {layer.name!r} ({type(layer).__name__}) has a linear "
        f"activation, so it outputs logits, but the loss {name} expects probabilities: "
        f"training would stay at chance. Set the loss's from_logits (loss: {{name: {name}, "
        f"from_logits: true}} in the experiment's config or --config file; exports then "
        f"apply the {wanted} themselves), or give {layer.name!r} activation="
        f"'{wanted}'.")
