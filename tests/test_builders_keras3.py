"""The built-in builders and the README's plugin example build and train one
batch under Keras 3 through ``tf.keras`` (TF 2.16+ without
TF_USE_LEGACY_KERAS), on the TensorFlow and the JAX backend, with no code of
their own for Keras 3 (issue 23, item 3).

Each backend runs in a child interpreter: the backend is chosen when Keras is
first imported. A backend that this environment lacks is skipped.
"""

import json
import subprocess
import sys

import pytest

from support import KERAS3_BACKENDS, ROOT, child_env
from test_your_data import readme_block

# Tiny shapes: the point is that each builder builds, trains a step and
# predicts the right shape, not what it learns.
CHILD = r"""
import json, logging, sys
import numpy as np
import tensorflow as tf
import keras

assert tf.keras is keras or tf.keras.Model is keras.Model, "tf.keras is not Keras 3 here"
from estimator_keras import model_inputs
from experiments import catalog, models, registry
from experiments.config.data_info import DataInfo

catalog.load()
plugin = {}
exec(compile(sys.argv[1], "my_experiments.py", "exec"), plugin)
rng = np.random.default_rng(0)


def data(shape, classes, dtype="uint8", label_shape=()):
    return DataInfo(inputs={"image": {"shape": list(shape), "dtype": dtype}},
                    label_shape=list(label_shape), num_classes=classes)


cases = {
    "seed_cnn": (models.seed_cnn, {"filters": 2, "dense_units": 8}, data((12, 12, 1), 3), None),
    "seed_mlp": (models.seed_mlp, {"units": 8}, data((6, 6, 1), 3), None),
    "image_classifier": (models.image_classifier, {"filters": 2},
                         data((16, 16, 3), 4), None),
    "image_classifier_grey_2d": (models.image_classifier, {"filters": 2},
                                 data((8, 8), 2), None),
    "image_classifier_float_2d": (models.image_classifier, {"filters": 2},
                                  data((8, 8), 2, "float32"), None),
    "image_classifier_float_image": (models.image_classifier, {"filters": 2},
                                     data((8, 8, 3), 2, "float32"), None),
    "image_classifier_vector": (models.image_classifier, {"filters": 2},
                                data((5,), 3, "float32"), None),
    "image_classifier_scalar": (models.image_classifier, {"filters": 2},
                                data((), 2, "float32"), None),
    "image_segmenter": (models.unet, {"filters": 2, "depth": 2},
                        data((16, 16, 3), 3, label_shape=(16, 16)), "image_segmenter"),
    "readme_small_cnn": (plugin["small_cnn"], {"filters": 2, "dropout": 0.2},
                         data((8, 8, 1), 2), None),
}
out = {"keras": keras.__version__, "backend": keras.backend.backend()}
said = []
handler = logging.Handler()
handler.emit = lambda record: said.append(record.getMessage())
logging.getLogger("experiments").addHandler(handler)
logging.getLogger("experiments").setLevel(logging.INFO)

# The default experiment as the runner builds it: its plan's model in
# mixed_bfloat16 (what precision "auto" picks on most CPUs), compiled with its
# optimizer and cosine schedule.
from estimator_keras.engines import optimizers
from experiments import context, hparams
experiment = registry.get("fashion_mnist_cnn")
config = hparams.with_overrides(experiment.config, {"filters": "2", "dense_units": "8",
                                                    "max_steps": "10"})
info = data((12, 12, 1), 3)
plan = context.experiment_plan(experiment, config, info, policy="mixed_bfloat16")
keras.utils.set_random_seed(0)
model = plan.build_model()
model.compile(optimizer=optimizers.keras_optimizer(plan.optimizer, plan.learning_rate),
              loss=plan.loss, metrics=plan.metrics())
x = rng.integers(0, 256, (4, 12, 12, 1)).astype("float32")
loss = model.train_on_batch(x, rng.integers(0, 3, 4), return_dict=True)["loss"]
pred = np.asarray(model.predict(x, verbose=0))
out["plan"] = {"loss": float(loss), "shape": list(pred.shape), "dtype": str(pred.dtype),
               "sums": float(np.abs(pred.astype("float64").sum(axis=-1) - 1).max()),
               "class": type(model).__module__.split(".")[0],
               "conv": next(l for l in model.layers if "Conv" in type(l).__name__).compute_dtype}
for name, (build, hparams, info, experiment) in cases.items():
    keras.utils.set_random_seed(0)
    del said[:]
    model = build(hparams, info)
    build(hparams, info)  # built again: said once
    # How the input pipeline's features are matched to the model's inputs.
    model_inputs.check_feature_keys(model, [info.input_name])
    metrics = (registry.get(experiment).make_metrics(info) if experiment else ["accuracy"])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=metrics)
    shape = tuple(info.input_shape)
    x = (rng.integers(0, 256, (4, *shape)).astype("float32") if info.inputs["image"]["dtype"]
         == "uint8" else rng.standard_normal((4, *shape)).astype("float32"))
    y = rng.integers(0, info.num_classes, (4, *info.label_shape)).astype("int64")
    loss = model.train_on_batch(x, y, return_dict=True)["loss"]
    pred = np.asarray(model.predict(x, verbose=0))
    out[name] = {"loss": float(loss), "shape": list(pred.shape),
                 "sums": float(np.abs(pred.sum(axis=-1) - 1).max()),
                 "class": type(model).__module__.split(".")[0],
                 "layers": sorted({type(layer).__name__ for layer in model.layers}),
                 "said": list(said)}
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", KERAS3_BACKENDS)
def test_builders_train_a_batch_under_keras3(backend):
    env = child_env(TF_USE_LEGACY_KERAS="0", KERAS_BACKEND=backend)
    proc = subprocess.run([sys.executable, "-c", CHILD, readme_block("my_experiments.py")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found.pop("keras").startswith("3.") and found.pop("backend") == backend
    plan = found.pop("plan")
    # Computes in bfloat16, the softmax in float32 (precision.with_policy).
    assert plan.pop("conv") == "bfloat16" and plan.pop("dtype") == "float32", plan
    found["plan"] = plan
    expected = {"plan": [4, 3], "seed_cnn": [4, 3], "seed_mlp": [4, 3], "image_classifier": [4, 4],
                "image_classifier_grey_2d": [4, 2], "image_classifier_float_2d": [4, 2],
                "image_classifier_float_image": [4, 2], "image_classifier_vector": [4, 3],
                "image_classifier_scalar": [4, 2], "image_segmenter": [4, 16, 16, 3],
                "readme_small_cnn": [4, 2]}
    assert {name: r["shape"] for name, r in found.items()} == expected
    for name, result in found.items():
        assert result["class"] == "keras", (name, result)  # a Keras 3 model, not tf_keras
        assert result["loss"] > 0 and result["loss"] < 100, (name, result)
        assert result["sums"] < 1e-4, (name, result)  # softmax outputs
    # image_classifier decides by the dataset's dtype, and says which model it built.
    layers = {name: set(r["layers"]) for name, r in found.items() if "layers" in r}
    assert {"Rescaling", "Conv2D", "Reshape"} <= layers["image_classifier_grey_2d"]
    assert "Conv2D" not in layers["image_classifier_float_2d"]
    assert "Rescaling" not in layers["image_classifier_float_2d"]
    assert {"Flatten", "BatchNormalization", "Dense"} <= layers["image_classifier_float_2d"]
    assert {"Conv2D", "BatchNormalization"} <= layers["image_classifier_float_image"]
    assert "Rescaling" not in layers["image_classifier_float_image"]
    assert found["image_classifier_float_2d"]["said"] == [
        "image_classifier: an MLP on the input 'image' of shape [8, 8], float values, "
        "flattened and batch-normalized"]
    assert found["image_classifier_grey_2d"]["said"] == [
        "image_classifier: a conv net of 1 block on the input 'image' of shape [8, 8], "
        "integer values, pixels scaled by 1/255"]
