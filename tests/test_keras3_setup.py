"""Installing on Python 3.9-3.13, and which Keras each engine gets: the extras'
environment markers, ``list`` and ``--engine auto`` from metadata, and
prepare_keras / check_model_keras, whose errors come before any work.

Where a variable must be set before TensorFlow or Keras is imported, the case
runs in a child interpreter."""

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from estimator_keras import engines
from estimator_keras.engines import keras_setup, registry
from estimator_keras.engines.keras3 import checkpoints as keras3_checkpoints
from estimator_keras.errors import ConfigError
from support import ROOT, child_env, cli

KERAS3 = keras_setup.no_keras3_message() is None
TF_KERAS = importlib.util.find_spec("tf_keras") is not None
needs_keras3 = pytest.mark.skipif(not KERAS3, reason="Keras 3 with TensorFlow 2.16+ is not "
                                                     "installed here")


def _child(code, timeout=180, **env):
    """Runs ``code`` in a fresh interpreter with this tree importable and
    ``env`` on top of this process's environment (a None value unsets)."""
    environ = child_env()
    for name, value in env.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          env=environ, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


# --- setup.py: one `pip install -e '.[cpu]'` for Python 3.9-3.13 -----------

@pytest.fixture(scope="module")
def requirements(tmp_path_factory):
    """setup.py's extras as egg_info writes them: {extra: [Requirement]}."""
    requirements_mod = pytest.importorskip("packaging.requirements")
    pytest.importorskip("setuptools")
    out = tmp_path_factory.mktemp("egg")
    proc = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    info = next(out.glob("*.egg-info"))
    extras, section = {}, None
    for line in (info / "requires.txt").read_text().splitlines():
        if line.startswith("["):
            section, _, marker = line.strip("[]").partition(":")
            extras.setdefault(section, [])
        elif line.strip() and section:
            text = f"{line}; {marker}" if marker else line
            extras[section].append(requirements_mod.Requirement(text))
    return extras, (info / "PKG-INFO").read_text()


def _pins(extras, extra, python):
    """{distribution: specifier} that `pip install '.[extra]'` asks for on ``python``."""
    env = {"python_version": python, "python_full_version": python + ".0",
           "platform_system": "Linux", "platform_machine": "x86_64", "sys_platform": "linux"}
    return {r.name: str(r.specifier) for r in extras[extra]
            if r.marker is None or r.marker.evaluate(env)}


@pytest.mark.parametrize("python", ["3.9", "3.10", "3.11"])
@pytest.mark.parametrize("extra,tensorflow", [("cpu", "tensorflow-cpu"),
                                              ("gpu", "tensorflow")])
def test_old_pythons_get_tensorflow_215_with_the_estimator(requirements, python, extra,
                                                            tensorflow):
    pins = _pins(requirements[0], extra, python)
    assert pins[tensorflow] == "==2.15.*", pins
    assert pins["tensorflow-estimator"] == "==2.15.*" and pins["numpy"] == "<2", pins
    assert "keras" not in pins, pins


@pytest.mark.parametrize("python", ["3.12", "3.13"])
@pytest.mark.parametrize("extra,tensorflow", [("cpu", "tensorflow-cpu"),
                                              ("gpu", "tensorflow")])
def test_new_pythons_get_tensorflow_221_with_keras3(requirements, python, extra, tensorflow):
    pins = _pins(requirements[0], extra, python)
    assert pins[tensorflow] == "==2.21.*", pins
    assert pins["keras"] == "<4,>=3.15", pins
    assert "tensorflow-estimator" not in pins and "numpy" not in pins, pins
    # TensorFlow 2.16+ no longer brings it; the HParams summaries need it.
    assert "tensorboard" in pins, pins


def test_jax_extra_and_classifiers(requirements):
    extras, pkg_info = requirements
    assert "jax" in _pins(extras, "jax", "3.13") and "jax" in _pins(extras, "jax", "3.11")
    assert _pins(extras, "jax", "3.10") == {}, "Keras 3 (and so JAX) needs Python 3.11+"
    for python in ("3.9", "3.10", "3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {python}\n" in pkg_info, python
    # The keras extras stay as they were.
    assert _pins(extras, "keras-cpu", "3.11")["tensorflow-cpu"] == "<2.22,>=2.16"
    assert _pins(extras, "keras", "3.12")["tf-keras"] == "<2.22,>=2.16"


# --- list and auto: from metadata, without importing TensorFlow ---------------

def test_list_and_auto_import_no_tensorflow_and_agree_with_metadata():
    rc, out, err = _child("""
        import json, sys
        from estimator_keras import engines
        auto = engines.auto_from_metadata()
        print(json.dumps({"statuses": engines.statuses(), "auto": auto,
                          "loaded": sorted(m for m in sys.modules if m.split(".")[0] in
                                           ("tensorflow", "keras", "tf_keras", "jax"))}))
    """, timeout=60)
    assert rc == 0, err[-2000:]
    found = json.loads(out)
    assert found["loaded"] == []
    statuses = {name: (ok, text) for name, ok, text in found["statuses"]}
    assert list(statuses) == list(engines.names()) and "keras3" in statuses
    ok, text = statuses["keras3"]
    assert ok == KERAS3, text
    if KERAS3:
        keras_version = importlib.metadata.version("keras")
        assert f"Keras {keras_version}" in text, text
        assert ("jax " in text) == keras_setup.backend_installed("jax"), text
    else:
        assert "not available" in text and "Keras" in text, text
    # auto: estimator where it exists, else keras where tf-keras is tf.keras, else keras3.
    if statuses["estimator"][0]:
        assert found["auto"] == "estimator"
    elif TF_KERAS and os.environ.get("TF_USE_LEGACY_KERAS", "1") in ("1", "true", "True"):
        assert found["auto"] == "keras"
    elif KERAS3:
        assert found["auto"] == "keras3"


@needs_keras3
def test_auto_follows_tf_keras_and_keras3_model_dirs(tmp_path):
    estimator = dict((n, ok) for n, ok, _ in engines.statuses())["estimator"]
    if estimator:
        pytest.skip("the estimator engine is auto's pick here")
    assert engines.auto_from_metadata({"TF_USE_LEGACY_KERAS": "0"}) == "keras3"
    assert engines.auto_from_metadata({}) == ("keras" if TF_KERAS else "keras3")
    # A model dir the keras3 engine wrote stays on keras3.
    (tmp_path / keras3_checkpoints.INDEX).write_text('{"latest": null, "all": []}')
    assert engines.auto_from_metadata({}, model_dir=tmp_path) == "keras3"
    assert engines.auto_from_metadata({}, model_dir=tmp_path / "other") == (
        "keras" if TF_KERAS else "keras3")


def test_registry_names_every_engine_module():
    # A fourth engine is one folder and one registry entry (tests/test_a_fourth_engine.py).
    assert engines.choices() == ("auto",) + engines.names()
    for entry in registry.entries():
        module = entry.engine.split(":")[0]
        assert importlib.util.find_spec(module) is not None, (entry.name, module)
    with pytest.raises(ConfigError, match="unknown engine 'nope'.*keras3"):
        engines.get_engine("nope")
    with pytest.raises(ConfigError, match="unknown engine 'nope'.*auto"):
        engines.prepare_keras("nope", environ={})


# --- KERAS_BACKEND ------------------------------------------------------------

def test_keras_backend_as_keras_picks_it(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    assert keras_setup.keras_backend({"KERAS_BACKEND": "jax", "KERAS_HOME": str(home)})[0] == "jax"
    assert keras_setup.keras_backend({"KERAS_HOME": str(home)})[0] == "tensorflow"
    (home / "keras.json").write_text(json.dumps({"backend": "torch"}))
    backend, origin = keras_setup.keras_backend({"KERAS_HOME": str(home), "KERAS_BACKEND": ""})
    assert backend == "torch" and str(home / "keras.json") in origin


@pytest.mark.parametrize("backend", sorted(registry.get("keras3").backends))
def test_backend_installed_or_named_extra(backend):
    environ = {"KERAS_BACKEND": backend}
    if keras_setup.backend_installed(backend):
        # In a fresh interpreter: this one may have imported Keras on
        # another backend already.
        proc = subprocess.run(
            [sys.executable, "-c", "from estimator_keras.engines import keras_setup; "
                                   f"print(keras_setup.check_backend({environ!r}))"],
            cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split() == [backend]
        return
    with pytest.raises(ConfigError) as e:
        keras_setup.check_backend(environ)
    assert f"KERAS_BACKEND={backend}" in str(e.value) and "not installed" in str(e.value)
    assert registry.get("keras3").backend(backend).install in str(e.value)
    if backend == "jax":
        assert "pip install -e '.[jax]'" in str(e.value)


@pytest.mark.parametrize("backend,match", [("jaxx", "expected one of jax, tensorflow \\("),
                                           ("numpy", "only runs inference")])
def test_unknown_or_inference_backends_are_refused(backend, match):
    with pytest.raises(ConfigError, match=match):
        keras_setup.check_backend({"KERAS_BACKEND": backend})


# --- prepare_keras: the engine decides which Keras tf.keras is -----------------

_WHICH_KERAS = """
    import os, sys
    from estimator_keras import engines
    name = engines.prepare_keras({engine!r})
    import tensorflow as tf
    print(name, tf.keras.Model.__module__, os.environ.get("TF_USE_LEGACY_KERAS"))
"""


@needs_keras3
def test_keras3_wins_over_the_legacy_variable_the_package_sets():
    # TF_USE_LEGACY_KERAS=1 as `import estimator_keras` (or tox) leaves it
    # where tf-keras is installed: --engine keras3 still gets Keras 3.
    rc, out, err = _child(_WHICH_KERAS.format(engine="keras3"), TF_USE_LEGACY_KERAS="1",
                          KERAS_BACKEND=None)
    assert rc == 0, err[-2000:]
    name, module, variable = out.split()
    assert name == "keras3" and module.startswith("keras.src.") and variable == "0", out


@pytest.mark.skipif(not TF_KERAS, reason="tf-keras is not installed here")
def test_keras_engine_keeps_tf_keras():
    rc, out, err = _child(_WHICH_KERAS.format(engine="keras"), TF_USE_LEGACY_KERAS=None)
    assert rc == 0, err[-2000:]
    name, module, variable = out.split()
    assert name == "keras" and module.startswith("tf_keras.") and variable == "1", out


@pytest.mark.skipif(not TF_KERAS or not KERAS3, reason="needs tf-keras and Keras 3")
def test_keras3_after_tensorflow_handed_out_keras2_is_refused():
    rc, out, err = _child("""
        import os
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
        import tensorflow as tf
        tf.keras.Model  # Keras 2 from now on
        from estimator_keras import engines
        from estimator_keras.errors import ConfigError
        try:
            engines.prepare_keras("keras3")
        except ConfigError as e:
            print("REFUSED", e)
    """, KERAS_BACKEND=None)
    assert rc == 0, err[-2000:]
    assert out.startswith("REFUSED") and "before importing tensorflow" in out, out
    assert "tf_keras" in out, out


@pytest.mark.skipif(not KERAS3 or not keras_setup.backend_installed("jax"),
                    reason="needs Keras 3 and JAX")
def test_backend_change_after_keras_import_is_refused():
    rc, out, err = _child("""
        import os
        import keras  # on the TensorFlow backend
        os.environ["KERAS_BACKEND"] = "jax"
        from estimator_keras import engines
        from estimator_keras.errors import ConfigError
        try:
            engines.prepare_keras("keras3")
        except ConfigError as e:
            print("REFUSED", e)
    """, KERAS_BACKEND=None, TF_USE_LEGACY_KERAS="0")
    assert rc == 0, err[-2000:]
    assert "already imported on the tensorflow backend" in out, out


# --- the CLI: one paragraph, exit 2, before any work ---------------------------

def _train(tmp_path, *flags, **env):
    environ = child_env(**{k: v for k, v in env.items() if v is not None})
    for name in (k for k, v in env.items() if v is None):
        environ.pop(name, None)
    return cli("train", "fashion_mnist_mlp", "--model-dir", tmp_path / "run", "--data-dir",
               tmp_path / "data", *flags, env=environ, timeout=120)


def _assert_refused_before_work(tmp_path, rc, err):
    assert rc == 2, err[-2000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err[-2000:]
    assert not (tmp_path / "run").exists() and not (tmp_path / "data").exists()


@pytest.mark.skipif(KERAS3, reason="Keras 3 is installed here")
def test_cli_keras3_without_keras3(tmp_path):
    rc, _, err = _train(tmp_path, "--engine", "keras3")
    _assert_refused_before_work(tmp_path, rc, err)
    assert "--engine keras3" in err and "Keras 3" in err and "pip install" in err, err


@needs_keras3
def test_cli_unknown_backend(tmp_path):
    rc, _, err = _train(tmp_path, "--engine", "keras3", KERAS_BACKEND="tensorflw")
    _assert_refused_before_work(tmp_path, rc, err)
    assert "KERAS_BACKEND=tensorflw" in err and "jax, tensorflow (" in err, err


@needs_keras3
def test_cli_backend_not_installed_names_the_extra(tmp_path):
    missing = [b for b in registry.get("keras3").backends if not keras_setup.backend_installed(b)]
    if not missing:
        pytest.skip("every training backend is installed here")
    rc, _, err = _train(tmp_path, "--engine", "keras3", KERAS_BACKEND=missing[0])
    _assert_refused_before_work(tmp_path, rc, err)
    assert f"KERAS_BACKEND={missing[0]}" in err and "not installed" in err, err
    assert registry.get("keras3").backend(missing[0]).install in " ".join(err.split()), err


@needs_keras3
def test_cli_list_still_answers_and_tune_refuses_up_front(tmp_path):
    environ = child_env(KERAS_BACKEND="tensorflw")
    rc, out, err = cli("list", env=environ, timeout=120)
    assert rc == 0, err[-2000:]
    assert re.search(r"\n  keras3 +available .*KERAS_BACKEND: tensorflw, which it cannot train "
                     r"on here", out), out
    rc, _, err = cli("tune", "fashion_mnist_mlp", "--space", "learning_rate=0.001,0.01",
                     "--model-dir", tmp_path / "run", "--data-dir", tmp_path / "data",
                     "--engine", "keras3", env=environ, timeout=120)
    _assert_refused_before_work(tmp_path, rc, err)
    assert "KERAS_BACKEND=tensorflw" in err, err


def test_cli_engine_flag_offers_every_engine():
    rc, out, _ = cli("train", "--help")
    assert rc == 0
    assert "{auto,estimator,keras,keras3}" in " ".join(out.split()), out


# --- check_model_keras: the builder's model is the engine's Keras --------------

def _keras2():
    """The Keras 2 module here (tf-keras, or TF 2.15's keras 2.x), or None."""
    if TF_KERAS:
        import tf_keras  # pylint: disable=import-outside-toplevel
        return tf_keras
    if importlib.util.find_spec("keras") and not KERAS3:
        import keras  # pylint: disable=import-outside-toplevel
        return keras
    return None


def _keras3():
    if not KERAS3 or (os.environ.get("KERAS_BACKEND") or "tensorflow") != "tensorflow":
        return None
    import keras  # pylint: disable=import-outside-toplevel
    return keras if keras.__version__.startswith("3.") else None


def _tiny(keras_module):
    inputs = keras_module.Input((4,))
    return keras_module.Model(inputs, keras_module.layers.Dense(2)(inputs))


def test_builders_model_must_be_the_engines_keras():
    k2, k3 = _keras2(), _keras3()
    if k2 is None and k3 is None:
        pytest.skip("no Keras here")
    if k2 is not None:
        model = _tiny(k2)
        engines.check_model_keras(model, "keras")
        engines.check_model_keras(model, "estimator")
        with pytest.raises(ConfigError, match=r"keras3 engine trains Keras 3 models.*Keras 2 "
                                              r"model \((tf_)?keras\.src\.engine\."):
            engines.check_model_keras(model, "keras3")
    if k3 is not None:
        model = _tiny(k3)
        engines.check_model_keras(model, "keras3")
        with pytest.raises(ConfigError, match=r"keras engine trains Keras 2 models.*Keras 3 "
                                              r"model \(keras\.src\.models\."):
            engines.check_model_keras(model, "keras")
    with pytest.raises(ConfigError, match="not a Keras model"):
        engines.check_model_keras(object(), "keras3", source="experiment x's builder")


def test_a_model_mixing_keras2_and_keras3_is_refused():
    k2, k3 = _keras2(), _keras3()
    if k2 is None or k3 is None or not TF_KERAS:
        pytest.skip("needs tf-keras and Keras 3 (TensorFlow backend)")

    class Keras3Model(k3.Model):
        def __init__(self):
            super().__init__()
            self.head = k3.layers.Dense(2)
            self.extra = k2.layers.Dense(2)  # Keras 3 does not track it

        def call(self, x):
            return self.head(x)

    class Keras2Model(k2.Model):
        def __init__(self):
            super().__init__()
            self.blocks = [k2.layers.Dense(2), k3.layers.Dense(2)]

        def call(self, x):
            return self.blocks[0](x)

    for model in (Keras3Model(), Keras2Model()):
        for engine in ("keras", "keras3"):
            with pytest.raises(ConfigError, match=r"mixes Keras 2 and Keras 3 objects \(tf_keras"
                                                  r"\.src\.\S+ is Keras 2, keras\.src\.\S+ is "
                                                  r"Keras 3\)"):
                engines.check_model_keras(model, engine)


def test_error_messages_are_one_paragraph_naming_the_variable():
    with pytest.raises(ConfigError) as e:
        keras_setup.check_backend({"KERAS_BACKEND": "mxnet"})
    assert "\n" not in str(e.value) and re.search(r"KERAS_BACKEND=mxnet", str(e.value))
