"""keras.io's models, as its Keras 3 examples write them, through the
commands a user runs: tests/keras_io_gallery.py is a user's ``--module``
with four of them (a Sequential convnet; a residual net with its
augmentation block and logits out; a frozen base under a new head; a model
whose class overrides ``train_step``). Each trains, evaluates, exports and
predicts through the tutorial's ``predict.py`` on the keras3 engine (its
TensorFlow and JAX backends) and on the estimator engine; where an engine
cannot train one as written, it refuses in one paragraph that says why,
before anything is written."""

import json
import os
import re
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from docs_pages import readme_block
from support import KERAS3_BACKENDS, ROOT, cli, child_env, fresh_python

MODULE = os.path.join(ROOT, "tests", "keras_io_gallery.py")
MODELS = ["gallery_mnist_convnet", "gallery_from_scratch", "gallery_transfer",
          "gallery_custom_fit"]
# The models whose last layer outputs logits (``from_logits=True``).
LOGITS = {"gallery_from_scratch", "gallery_transfer"}
CLASSES = ["red", "green", "blue"]


def _estimator_available():
    return tf.__version__.startswith("2.15")


ENGINES = [
    pytest.param("estimator", None, id="estimator", marks=pytest.mark.skipif(
        not _estimator_available(), reason="tf.estimator ends with TensorFlow 2.15")),
    *(pytest.param("keras3", case.values[0], id=f"keras3-{case.values[0]}", marks=case.marks)
      for case in KERAS3_BACKENDS),
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The gallery's dataset, prepared once for the module's cases."""
    path = tmp_path_factory.mktemp("gallery") / "data"
    rc, _, err = cli("--module", MODULE, "prepare", "coloured_squares", "--data-dir", path,
                     timeout=300)
    assert rc == 0, err[-3000:]
    return path


def _env(backend):
    return child_env(**({"KERAS_BACKEND": backend} if backend else {}))


def test_the_module_lists_the_four_models():
    rc, out, err = cli("--module", MODULE, "list", timeout=120)
    assert rc == 0, err[-3000:]
    listed = re.findall(r"^  (gallery_\w+) ", out, re.M)
    assert listed == sorted(MODELS), out


def test_the_exports_serve_a_user_class_that_overrides_call_through_its_call():
    """A plain functional model stands in for the user's class only where
    the class changes training, not the forward pass: a class whose call
    post-processes the graph's outputs is served through that call."""
    keras = pytest.importorskip("keras")
    if not keras.__version__.startswith("3."):
        pytest.skip("the keras3 engine's exports need Keras 3")
    from estimator_keras.engines.keras3.export import serving_model

    class Doubled(keras.Model):
        def call(self, inputs, training=None):
            return super().call(inputs, training=training) * 2.0

    class CustomModel(keras.Model):
        def train_step(self, data):
            return super().train_step(data)

    x = np.ones((2, 4), "float32")
    for cls, replaced in ((Doubled, False), (CustomModel, True)):
        inputs = keras.Input((4,))
        model = cls(inputs, keras.layers.Dense(3)(inputs))
        served = serving_model(model)
        assert (served is not model) == replaced, cls
        np.testing.assert_allclose(served.predict(x, verbose=0), model.predict(x, verbose=0),
                                   rtol=1e-6)


def test_the_savedmodel_child_of_a_dead_parent_ends_before_it_imports_tensorflow(tmp_path):
    """The JAX export's SavedModel writer dies with the training process: one
    whose parent is already gone ends (status 125) before its seconds of
    importing TensorFlow, which a stand-in package here would record."""
    from estimator_keras.engines.keras3 import export

    marker = tmp_path / "imported"
    fake = tmp_path / "site" / "tensorflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    spec = {"model": str(tmp_path / "model.keras"), "target": str(tmp_path / "saved_model")}
    command = export._child_command(spec)  # pylint: disable=protected-access
    command[3] = "1"  # the parent it was started for: not the one it has
    env = child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(fake.parent), env["PYTHONPATH"]])
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 125, proc.stderr[-3000:]
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("engine,backend", ENGINES)
def test_a_keras_io_model_trains_evaluates_exports_and_predicts(tmp_path, data_dir, engine,
                                                                backend, name):
    env = _env(backend)
    run = tmp_path / "run"
    common = ["--module", MODULE, "--data-dir", data_dir, "--model-dir", run]
    rc, out, err = cli("train", name, "--engine", engine, *common, timeout=900, env=env)
    if engine == "estimator" and name == "gallery_custom_fit":
        # model_to_estimator never calls train_step: refused before any work.
        assert rc == 2, out + err[-3000:]
        (error,) = [line for line in err.splitlines() if line.startswith("error:")]
        assert re.search(r"returned a CustomModel model that overrides "
                         r"keras\.Model\.train_step: the estimator engine .* never calls it.*"
                         r"--engine keras \(Keras 2\) or keras3 \(Keras 3\)", error), err
        assert not run.exists(), sorted(os.listdir(run))
        return
    assert rc == 0, err[-3000:]
    final = re.search(r"final metrics: accuracy ([\d.]+)", out)
    assert final, out + err[-3000:]
    accuracy = float(final.group(1))
    assert accuracy >= 0.9, out + err[-3000:]

    # evaluate rebuilds the model and reads its latest checkpoint.
    rc, out, err = cli("evaluate", name, "--engine", engine, *common, "--json",
                       timeout=600, env=env)
    assert rc == 0, err[-3000:]
    assert abs(json.loads(out)["accuracy"] - accuracy) < 1e-3, out

    # export again, in a process whose Keras names its layers afresh.
    rc, _, err = cli("export", name, *common, "--export-dir", run / "again", timeout=600,
                     env=env)
    assert rc == 0, err[-3000:]
    exports = [run / "export", run / "best", run / "again"]
    for export in exports:
        info = json.loads((export / "export.json").read_text())
        assert list(info["inputs"]) == ["image"], info
        assert info["outputs"] == ["probabilities", "class_id", "class_name"], info
        assert info.get("output_activation") == ("softmax" if name in LOGITS else None), info
        assert info["class_names"] == CLASSES, info
    _predict_as_the_tutorial_does(tmp_path, exports, backend)


def _predict_as_the_tutorial_does(tmp_path, exports, backend):
    """The tutorial's predict.py, as written, on each export, in a Python
    without this package: a photo of a red square, larger than the records'
    images, names the class "red" through model.h5 and the SavedModel."""
    rng = np.random.default_rng(3)
    photo = rng.integers(0, 90, (48, 48, 3)).astype(np.uint8)
    photo[12:30, 20:38, 0] += 150
    (tmp_path / "my_photo.jpg").write_bytes(tf.io.encode_jpeg(photo, quality=95).numpy())
    snippet = readme_block("predict.py") + readme_block("predict.py, continued")
    script = "".join(snippet.replace('"runs/image_classifier/export"', repr(str(export)))
                     for export in exports)
    # A Keras 3 model.h5 is read by the Keras 3 of tf.keras: the keras env
    # (tf-keras beside the JAX backend) asks for it as a Keras 3 user would.
    variables = {"TF_USE_LEGACY_KERAS": "0"} if backend else {}
    lines = fresh_python(script, tmp_path, timeout=300, **variables).splitlines()
    assert len(lines) == 2 * len(exports), lines
    for h5_line, served in zip(lines[::2], lines[1::2]):
        name, share = h5_line.split()
        # The top probability of three classes (a logits model's scores go
        # through the softmax export.json names).
        assert name == "red" and 1 / 3 <= float(share.rstrip("%")) / 100 <= 1, lines
        assert served == "[b'red']", lines


@pytest.mark.slow
def test_the_keras_engine_refuses_a_keras_io_model_naming_why(tmp_path, data_dir):
    """keras.io's Keras 3 examples import keras, which is Keras 3 beside
    tf-keras: the keras engine (Keras 2) refuses them before any work."""
    pytest.importorskip("tf_keras", reason="the keras engine needs tf-keras")
    run = tmp_path / "run"
    rc, out, err = cli("--module", MODULE, "train", "gallery_mnist_convnet", "--engine",
                       "keras", "--data-dir", data_dir, "--model-dir", run, timeout=300,
                       env=child_env(TF_USE_LEGACY_KERAS="1"))
    assert rc == 2, out + err[-3000:]
    (error,) = [line for line in err.splitlines() if line.startswith("error:")]
    assert re.search(r"the keras engine trains Keras 2 models, but experiment "
                     r"gallery_mnist_convnet's model builder returned a Keras 3 model", error), err
    assert not run.exists()
