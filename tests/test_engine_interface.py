"""One engine interface: every registered engine implements
:class:`estimator_keras.engines.base.Engine`, and what must be known before an
engine is imported (its cluster roles) is known for each of them. That no
module outside engines/ decides by an engine's name is
tests/test_engine_house.py's."""

import inspect
import subprocess
import sys

import pytest

from estimator_keras import engines
from estimator_keras.distribute import strategy as strategy_lib
from estimator_keras.engines import base, registry
from estimator_keras.engines.keras3 import checkpoints as keras3_checkpoints
from estimator_keras.errors import ConfigError
from support import ROOT, child_env


def test_every_registered_engine_has_its_cluster_roles():
    for name in engines.names():
        spec = registry.get(name).cluster
        assert "chief" in spec.tasks, name
        assert set(spec.tasks) <= {"chief", "worker", "ps", "evaluator"}, name
        assert spec.strategies and set(spec.strategies) <= set(
            strategy_lib.CONCRETE_STRATEGIES), name


def test_the_interface_is_documented():
    for name, member in inspect.getmembers(base.Engine, inspect.isfunction):
        if not name.startswith("_"):
            assert inspect.getdoc(member), f"Engine.{name} has no docstring"
    assert {"train", "evaluate", "latest_checkpoint", "checkpoint_step", "check_compatible",
            "export", "export_if_best"} <= base.Engine.__abstractmethods__


@pytest.mark.parametrize("name", engines.names())
def test_every_registered_engine_implements_the_interface(name):
    try:
        engine = engines.get_engine(name)
    except (ImportError, AttributeError, ConfigError) as e:
        # An engine this environment cannot import (tf.estimator past TF 2.15,
        # Keras 3 beside TF 2.15): its own environment's run checks it.
        pytest.skip(f"the {name} engine does not import here: {e}")
    assert isinstance(engine, base.Engine)
    assert engine.name == name
    assert not getattr(type(engine), "__abstractmethods__", None)
    for method in base.Engine.__abstractmethods__:
        assert getattr(type(engine), method) is not getattr(base.Engine, method), method


def test_check_cluster_refuses_what_an_engine_does_not_run():
    engines.check_cluster("estimator", ps="--ps 1", evaluator="--evaluator",
                          workers="--workers 2", strategy="parameter_server")
    engines.check_cluster("keras", workers="--workers 2", strategy="multi_worker_mirrored")
    with pytest.raises(ConfigError, match=r"keras engine .* --ps 1 and --evaluator cannot be "
                                          r"used with it.*--engine estimator"):
        engines.check_cluster("keras", ps="--ps 1", evaluator="--evaluator")
    with pytest.raises(ConfigError, match=r"keras3 engine .*--ps 1 cannot be used with it"):
        engines.check_cluster("keras3", ps="--ps 1", environ={"KERAS_BACKEND": "jax"})
    # Several processes: on JAX only (keras-team/keras#20585 on TensorFlow).
    tensorflow = {"KERAS_BACKEND": "tensorflow"}
    with pytest.raises(ConfigError, match=r"keras3 engine .*only on the JAX backend.*20585"):
        engines.check_cluster("keras3", workers="--workers 2", environ=tensorflow)
    with pytest.raises(ConfigError, match=r"--strategy multi_worker_mirrored"):
        engines.check_cluster("keras3", strategy="multi_worker_mirrored", environ=tensorflow)
    engines.check_cluster("keras3", workers="--workers 2", strategy="multi_worker_mirrored",
                          environ={"KERAS_BACKEND": "jax"})
    engines.check_cluster("keras3", strategy="mirrored", environ=tensorflow)
    engines.check_cluster("keras3", strategy="auto", environ=tensorflow)


def test_every_engine_choice_reaches_the_train_parser():
    from experiments import cli  # pylint: disable=import-outside-toplevel

    parser = cli.build_parser()
    for name in engines.choices():
        assert parser.parse_args(["train", "x", "--engine", name]).engine == name
        assert parser.parse_args(["evaluate", "x", "--engine", name]).engine == name


def test_the_cli_prepares_keras_before_tensorflow_loads():
    # engines.prepare_keras stands in for the real one here: it records what
    # it was asked and whether TensorFlow was already loaded, then stops.
    code = ("import sys\n"
            "from estimator_keras import engines\n"
            "from estimator_keras.errors import ConfigError\n"
            "def record(name, environ=None, model_dir=None):\n"
            "    print('prepare', name, 'tensorflow' in sys.modules)\n"
            "    raise ConfigError('stopped here')\n"
            "engines.prepare_keras = record\n"
            "from experiments import cli\n"
            "sys.exit(cli.main(sys.argv[1:]))\n")
    for argv, engine in ((["train", "fashion_mnist_cnn", "--engine", "keras"], "keras"),
                         (["evaluate", "fashion_mnist_cnn"], "auto")):
        proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, env=child_env(),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout.split() == ["prepare", engine, "False"]
        assert "stopped here" in proc.stderr


def test_auto_continues_a_model_dir_with_the_engine_that_wrote_it(tmp_path):
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    runnable = {name for name, ok, _ in engines.statuses() if ok}
    keras = engines.keras_major_version()
    estimator_dir, keras_dir, keras3_dir = (tmp_path / n for n in ("est", "keras", "keras3"))
    # The Estimator's checkpoints hold its global step; the keras engine's do not.
    tf.train.Checkpoint(estimator_global_step=tf.Variable(7, dtype=tf.int64)).save(
        str(estimator_dir / "model.ckpt"))
    tf.train.Checkpoint(kernel=tf.Variable(1.0)).save(str(keras_dir / "model.ckpt"))
    keras3_dir.mkdir()
    (keras3_dir / keras3_checkpoints.INDEX).write_text('{"latest": "ckpt-5.weights.h5", "all": []}')

    assert engines.auto_for_model_dir(None) == "auto"
    assert engines.auto_for_model_dir(tmp_path) == "auto"  # no checkpoint
    # Each stays with its writer where that engine runs with this tf.keras ...
    assert engines.auto_for_model_dir(estimator_dir) == (
        "estimator" if "estimator" in runnable and keras == 2 else "auto")
    assert engines.auto_for_model_dir(keras_dir) == (
        "keras" if "keras" in runnable and keras == 2 else "auto")
    assert engines.auto_for_model_dir(keras3_dir) == (
        "keras3" if "keras3" in runnable and keras == 3 else "auto")
    # ... and where tf.keras is Keras 3, a TF checkpoint goes to keras3 (migration).
    if keras == 3:
        assert engines.resolve_engine("auto", model_dir=keras_dir) == "keras3"
        assert engines.resolve_engine("auto", model_dir=estimator_dir) == "keras3"
    else:
        assert engines.resolve_engine("auto", model_dir=keras_dir) == "keras"
