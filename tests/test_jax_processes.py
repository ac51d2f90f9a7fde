"""Tests of estimator_keras.distribute.jax_processes: the JAX process group read
from a Kubeflow JAXJob's variables, Vertex AI's CLUSTER_SPEC or TF_CONFIG, the
keras3 engine's cluster rules in estimator_keras.engines, and the CLI's refusals
before anything trains. Parsing needs neither JAX nor Keras; only the CLI cases
run Keras 3 on JAX (skipped where they are not installed)."""

import importlib.util
import json
import os
import pathlib
import re

import pytest

from estimator_keras import engines
from estimator_keras.distribute import jax_processes
from estimator_keras.distribute.jax_processes import ProcessGroup, from_environ
from estimator_keras.distribute.tf_config import ClusterInfo, parse_tf_config
from estimator_keras.errors import ClusterConfigError, ConfigError, UsageError
from support import ROOT, checkpoint_steps, child_env, cli, keras3_installed, latest_step

KERAS_ISSUE = "keras-team/keras#20585"
CLUSTER_VARIABLES = jax_processes.JAXJOB_VARIABLES + ("CLUSTER_SPEC", "TF_CONFIG")


def jaxjob(address="10.0.0.5", port="6666", count="4", rank="2", **extra):
    env = {"COORDINATOR_ADDRESS": address, "COORDINATOR_PORT": port,
           "NUM_PROCESSES": count, "PROCESS_ID": rank}
    env.update(extra)
    return env


VERTEX_CLUSTER = {"workerpool0": ["h0:2222"], "workerpool1": ["h1:2222", "h2:2222"]}


def cluster_spec(cluster=None, task_type="workerpool1", index=1):
    return json.dumps({"cluster": VERTEX_CLUSTER if cluster is None else cluster,
                       "environment": "cloud", "task": {"type": task_type, "index": index}})


def tf_config(cluster, task_type, index):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


TF_CLUSTER = {"chief": ["c0:3333"], "worker": ["w0:3333", "w1:3333"]}


def refusal(environ):
    """The ClusterConfigError message from_environ raises for ``environ``."""
    with pytest.raises(ClusterConfigError) as info:
        from_environ(environ)
    return str(info.value)


# ------------------------------------------------------------------ Kubeflow JAXJob

def test_jaxjob_variables_make_the_group():
    group = from_environ(jaxjob())
    assert isinstance(group, ProcessGroup)
    assert (group.coordinator, group.num_processes, group.process_id) == ("10.0.0.5:6666", 4, 2)
    assert "JAXJob" in group.source
    assert not group.is_writer
    # Kubeflow's service name as the coordinator, surrounding blanks ignored.
    group = from_environ(jaxjob(address=" job-worker-0 ", port=" 6666 ", count="2", rank="0"))
    assert (group.coordinator, group.num_processes, group.process_id) == ("job-worker-0:6666", 2, 0)
    assert group.is_writer


@pytest.mark.parametrize("address, coordinator", [
    ("fe80::1", "[fe80::1]:6666"),
    ("::1", "[::1]:6666"),
    ("[2001:db8::7]", "[2001:db8::7]:6666"),   # already bracketed: not doubled
])
def test_jaxjob_ipv6_host_gets_brackets(address, coordinator):
    assert from_environ(jaxjob(address=address)).coordinator == coordinator


@pytest.mark.parametrize("given", [
    ("COORDINATOR_ADDRESS",),
    ("COORDINATOR_ADDRESS", "NUM_PROCESSES"),
    ("COORDINATOR_PORT", "NUM_PROCESSES", "PROCESS_ID"),
    ("PROCESS_ID",),
])
def test_partial_jaxjob_names_every_missing_variable(given):
    full = jaxjob()
    message = refusal({name: full[name] for name in given})
    missing = [v for v in jax_processes.JAXJOB_VARIABLES if v not in given]
    tail = message.split("missing", 1)[1]
    for name in missing:
        assert name in tail, (name, message)
    for name in given:
        assert name not in tail, (name, message)


def test_blank_jaxjob_variable_counts_as_missing():
    message = refusal(jaxjob(rank="  "))
    assert "missing PROCESS_ID" in message


@pytest.mark.parametrize("name, value", [
    ("COORDINATOR_PORT", "0"),
    ("COORDINATOR_PORT", "70000"),
    ("COORDINATOR_PORT", "abc"),
    ("COORDINATOR_PORT", "-1"),
    ("NUM_PROCESSES", "0"),
    ("NUM_PROCESSES", "-3"),
    ("NUM_PROCESSES", "two"),
    ("PROCESS_ID", "4"),       # == NUM_PROCESSES
    ("PROCESS_ID", "9"),
    ("PROCESS_ID", "-1"),
    ("PROCESS_ID", "1.5"),
])
def test_bad_jaxjob_value_names_the_variable(name, value):
    environ = jaxjob()
    environ[name] = value
    message = refusal(environ)
    assert f"{name}={value!r}" in message
    others = [v for v in jax_processes.JAXJOB_VARIABLES if v != name]
    assert not any(f"{v}=" in message for v in others), message


@pytest.mark.parametrize("address", ["two words", "host/path"])
def test_bad_coordinator_address_is_refused(address):
    assert "COORDINATOR_ADDRESS" in refusal(jaxjob(address=address))


@pytest.mark.parametrize("address", ["h0:1234", "[::1]:5", "[h0]", "[::1"])
def test_coordinator_address_with_a_port_is_refused(address):
    assert "COORDINATOR_ADDRESS" in refusal(jaxjob(address=address))


def test_jaxjob_errors_are_usage_errors():
    # The CLI exits 2 on a UsageError.
    assert issubclass(ClusterConfigError, UsageError)
    with pytest.raises(UsageError):
        from_environ(jaxjob(port="0"))


# ------------------------------------------------------------------ Vertex AI

def test_vertex_cluster_spec_makes_the_group():
    group = from_environ({"CLUSTER_SPEC": cluster_spec()})
    assert (group.coordinator, group.num_processes, group.process_id) == ("h0:2222", 3, 2)
    assert "CLUSTER_SPEC" in group.source
    first_worker = from_environ({"CLUSTER_SPEC": cluster_spec(index=0)})
    assert first_worker.process_id == 1
    primary = from_environ({"CLUSTER_SPEC": cluster_spec(task_type="workerpool0", index=0)})
    assert (primary.process_id, primary.is_writer, primary.num_processes) == (0, True, 3)


@pytest.mark.parametrize("text, mentions", [
    ("{not json", ["JSON"]),
    ("[1, 2]", ['"cluster"']),
    (cluster_spec(dict(VERTEX_CLUSTER, workerpool2=["r0:2222"], workerpool3=["e0:2222"])),
     ["workerpool2", "workerpool3"]),
    (cluster_spec(dict(VERTEX_CLUSTER, workerpool2=["r0:2222"])), ["workerpool2"]),
    (cluster_spec({"workerpool0": ["h0:2222", "h9:2222"], "workerpool1": ["h1:2222"]},
                  "workerpool1", 0), ["workerpool0", "exactly one"]),
    (cluster_spec({"workerpool1": ["h1:2222"]}, "workerpool1", 0), ["workerpool0"]),
    (cluster_spec(task_type="chief", index=0), ["task.type", "'chief'"]),
    (cluster_spec({"workerpool0": ["h0:2222"]}, "workerpool1", 0), ["task.type"]),
    (cluster_spec(index=2), ["task.index is 2"]),
    (cluster_spec(index=-1), ["task.index is -1"]),
    (cluster_spec(index="1"), ["task.index"]),
    (cluster_spec({"workerpool0": ["h0"], "workerpool1": ["h1:2222"]}, "workerpool1", 0),
     ["workerpool0", "'h0'"]),
    (cluster_spec({"workerpool0": ["h0:2222"], "workerpool1": ["h1:99999"]}), ["h1:99999"]),
])
def test_bad_cluster_spec_is_refused_naming_it(text, mentions):
    message = refusal({"CLUSTER_SPEC": text})
    assert message.startswith("CLUSTER_SPEC"), message
    for part in mentions:
        assert part in message, (part, message)


def test_cluster_spec_of_one_replica_is_one_process():
    assert from_environ({"CLUSTER_SPEC": cluster_spec(
        {"workerpool0": ["h0:2222"]}, "workerpool0", 0)}) is None


# ------------------------------------------------------------------ TF_CONFIG

def test_tf_config_chief_is_the_coordinator():
    group = from_environ({"TF_CONFIG": tf_config(TF_CLUSTER, "worker", 1)})
    assert (group.coordinator, group.num_processes, group.process_id) == ("c0:3333", 3, 2)
    assert "TF_CONFIG" in group.source
    chief = from_environ({"TF_CONFIG": tf_config(TF_CLUSTER, "chief", 0)})
    assert (chief.process_id, chief.is_writer) == (0, True)
    assert from_environ({"TF_CONFIG": tf_config(TF_CLUSTER, "worker", 0)}).process_id == 1


def test_tf_config_without_chief_coordinates_at_worker_zero():
    # parse_tf_config refuses a TF_CONFIG without a chief, so a worker-only
    # cluster reaches from_environ only as an already parsed ClusterInfo.
    info = ClusterInfo({"worker": ["w0:3333", "w1:3333", "w2:3333"]}, "worker", 1)
    group = from_environ({}, info)
    assert (group.coordinator, group.num_processes, group.process_id) == ("w0:3333", 3, 1)


def test_tf_config_info_argument_is_used_instead_of_the_environment():
    info = parse_tf_config(tf_config(TF_CLUSTER, "worker", 0))
    group = from_environ({"TF_CONFIG": tf_config(TF_CLUSTER, "worker", 1)}, info)
    assert group.process_id == 1


def test_tf_config_ps_and_evaluator_tasks_make_no_group():
    cluster = dict(TF_CLUSTER, ps=["p0:3333"])
    assert from_environ({"TF_CONFIG": tf_config(cluster, "ps", 0)}) is None
    assert from_environ({"TF_CONFIG": tf_config(TF_CLUSTER, "evaluator", 0)}) is None


def test_bad_tf_config_is_refused():
    with pytest.raises(ClusterConfigError, match="TF_CONFIG"):
        from_environ({"TF_CONFIG": "{oops"})


# ------------------------------------------------------------------ precedence, one process

def test_jaxjob_wins_over_cluster_spec_and_tf_config():
    environ = jaxjob(address="jax-host", port="1111", count="5", rank="4",
                     CLUSTER_SPEC=cluster_spec(), TF_CONFIG=tf_config(TF_CLUSTER, "worker", 1))
    group = from_environ(environ)
    assert (group.coordinator, group.num_processes, group.process_id) == ("jax-host:1111", 5, 4)
    assert "JAXJob" in group.source


def test_cluster_spec_wins_over_tf_config():
    environ = {"CLUSTER_SPEC": cluster_spec(index=0),
               "TF_CONFIG": tf_config(TF_CLUSTER, "worker", 1)}
    group = from_environ(environ)
    assert (group.coordinator, group.num_processes, group.process_id) == ("h0:2222", 3, 1)
    assert "CLUSTER_SPEC" in group.source
    # A blank CLUSTER_SPEC is no CLUSTER_SPEC.
    environ["CLUSTER_SPEC"] = "  "
    assert from_environ(environ).coordinator == "c0:3333"


def test_a_bad_variable_of_the_winner_is_not_hidden_by_the_others():
    environ = jaxjob(port="0", CLUSTER_SPEC=cluster_spec(),
                     TF_CONFIG=tf_config(TF_CLUSTER, "worker", 1))
    assert "COORDINATOR_PORT" in refusal(environ)


@pytest.mark.parametrize("environ", [
    {},
    jaxjob(count="1", rank="0"),
    # A JAXJob of one process is one process, whatever else is set.
    jaxjob(count="1", rank="0", CLUSTER_SPEC=cluster_spec()),
    {"TF_CONFIG": tf_config({"chief": ["c0:3333"]}, "chief", 0)},
    {"TF_CONFIG": ""},
    {"UNRELATED": "1"},
], ids=["nothing", "jaxjob-of-one", "jaxjob-of-one-beside-vertex", "tf-config-chief-only",
        "blank-tf-config", "unrelated"])
def test_one_process_is_no_group(environ):
    assert from_environ(environ) is None


def test_default_environ_is_os_environ(monkeypatch):
    for name in CLUSTER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert from_environ() is None
    for name, value in jaxjob().items():
        monkeypatch.setenv(name, value)
    assert from_environ().coordinator == "10.0.0.5:6666"


# ------------------------------------------------------------------ the group's properties

@pytest.mark.parametrize("coordinator, bind", [
    ("127.0.0.1:4000", "127.0.0.1:4000"),
    ("127.0.0.2:4000", "127.0.0.2:4000"),
    ("localhost:4000", "localhost:4000"),
    ("[::1]:4000", "[::1]:4000"),
    ("10.0.0.5:4000", None),
    ("job-worker-0:4000", None),
    ("[fe80::1]:4000", None),
    ("0.0.0.0:4000", None),
])
def test_bind_address(coordinator, bind):
    assert ProcessGroup(coordinator, 2, 0, "test").bind_address == bind


def test_bind_address_from_the_environment():
    assert from_environ(jaxjob(address="::1", port="4000")).bind_address == "[::1]:4000"
    assert from_environ(jaxjob(address="127.0.0.1", port="4000")).bind_address == "127.0.0.1:4000"
    assert from_environ(jaxjob(address="job-worker-0")).bind_address is None


def test_cluster_info_roles():
    group = ProcessGroup("h0:2222", 3, 0, "test")
    chief = group.cluster_info()
    assert (chief.task_type, chief.task_index) == ("chief", 0)
    assert chief.is_chief and chief.is_distributed and not chief.is_evaluator
    assert chief.num_workers == 3 and not chief.has_ps
    assert chief.cluster["chief"] == ["h0:2222"]
    for rank in (1, 2):
        info = ProcessGroup("h0:2222", 3, rank, "test").cluster_info()
        assert (info.task_type, info.task_index) == ("worker", rank - 1)
        assert not info.is_chief and info.is_distributed
        assert info.num_workers == 3
        assert info.task_name == f"worker-{rank - 1}"


@pytest.mark.parametrize("count", [2, 5])
def test_cluster_info_counts_every_process(count):
    for rank in range(count):
        info = from_environ(jaxjob(count=str(count), rank=str(rank))).cluster_info()
        assert info.num_workers == count
        assert info.is_chief == (rank == 0)


# ------------------------------------------------------------------ engines.cluster_info

def test_engines_cluster_info_keras3_on_jax_is_the_group():
    environ = jaxjob(KERAS_BACKEND="jax", TF_CONFIG=tf_config(TF_CLUSTER, "chief", 0))
    info, group = engines.cluster_info("keras3", environ)
    assert group == from_environ(environ)
    assert info == group.cluster_info()
    assert (info.task_type, info.task_index, info.num_workers) == ("worker", 1, 4)


def test_engines_cluster_info_keras3_on_jax_from_tf_config():
    environ = {"KERAS_BACKEND": "jax", "TF_CONFIG": tf_config(TF_CLUSTER, "worker", 1)}
    info, group = engines.cluster_info("keras3", environ)
    assert (group.coordinator, group.process_id) == ("c0:3333", 2)
    assert (info.task_type, info.task_index) == ("worker", 1)


def test_engines_cluster_info_keras3_on_jax_alone():
    info, group = engines.cluster_info("keras3", {"KERAS_BACKEND": "jax"})
    assert group is None
    assert not info.is_distributed and info.is_chief


def test_engines_cluster_info_keras3_on_jax_refuses_partial_jaxjob():
    with pytest.raises(ClusterConfigError, match="PROCESS_ID"):
        engines.cluster_info("keras3", {"KERAS_BACKEND": "jax", "COORDINATOR_ADDRESS": "h",
                                        "COORDINATOR_PORT": "1", "NUM_PROCESSES": "2"})


def test_engines_cluster_info_keras3_on_tensorflow_is_tf_config():
    text = tf_config(TF_CLUSTER, "worker", 1)
    environ = jaxjob(KERAS_BACKEND="tensorflow", TF_CONFIG=text, CLUSTER_SPEC=cluster_spec())
    info, group = engines.cluster_info("keras3", environ)
    assert group is None
    assert info == parse_tf_config(text)
    assert info.cluster == TF_CLUSTER and (info.task_type, info.task_index) == ("worker", 1)
    # No TF_CONFIG: one local process, whatever the JAXJob says.
    info, group = engines.cluster_info("keras3", jaxjob(KERAS_BACKEND="tensorflow"))
    assert group is None and not info.is_distributed


@pytest.mark.parametrize("backend", ["jax", "tensorflow"])
def test_engines_cluster_info_keras_engine_never_has_a_group(backend):
    text = tf_config(TF_CLUSTER, "worker", 0)
    environ = jaxjob(KERAS_BACKEND=backend, TF_CONFIG=text, CLUSTER_SPEC=cluster_spec())
    for engine in ("keras", "estimator"):
        info, group = engines.cluster_info(engine, environ)
        assert group is None
        assert info == parse_tf_config(text)
    # Even bad JAXJob variables are none of its business.
    info, group = engines.cluster_info("keras", jaxjob(KERAS_BACKEND=backend, port="0"))
    assert group is None and not info.is_distributed


# ------------------------------------------------------------------ engines.check_cluster

def test_check_cluster_keras3_several_processes_need_jax():
    with pytest.raises(ConfigError) as info:
        engines.check_cluster("keras3", workers="--workers 1",
                              environ={"KERAS_BACKEND": "tensorflow"})
    message = str(info.value)
    assert KERAS_ISSUE in message
    assert "KERAS_BACKEND=jax" in message
    assert "--workers 1" in message
    assert isinstance(info.value, UsageError)


def test_check_cluster_keras3_on_jax_passes():
    engines.check_cluster("keras3", workers="--workers 1", environ={"KERAS_BACKEND": "jax"})
    engines.check_cluster("keras3", workers="--workers 3", strategy="multi_worker_mirrored",
                          environ={"KERAS_BACKEND": "jax"})


def test_check_cluster_keras3_multi_worker_strategy_on_tensorflow_refused():
    with pytest.raises(ConfigError) as info:
        engines.check_cluster("keras3", strategy="multi_worker_mirrored",
                              environ={"KERAS_BACKEND": "tensorflow"})
    assert KERAS_ISSUE in str(info.value) and "KERAS_BACKEND=jax" in str(info.value)
    assert "--strategy multi_worker_mirrored" in str(info.value)


def test_check_cluster_keras3_one_process_on_tensorflow_passes():
    for strategy in (None, "auto", "none", "mirrored"):
        engines.check_cluster("keras3", strategy=strategy,
                              environ={"KERAS_BACKEND": "tensorflow"})


def test_check_cluster_keras3_still_refuses_ps_on_jax():
    with pytest.raises(ConfigError, match="--ps 1"):
        engines.check_cluster("keras3", ps="--ps 1", environ={"KERAS_BACKEND": "jax"})


# ------------------------------------------------------------------ the CLI refuses early

needs_keras3_jax = pytest.mark.skipif(
    not keras3_installed() or importlib.util.find_spec("jax") is None,
    reason="Keras 3 or JAX is not installed (pip install -e '.[jax]')")


def cli_env(**extra):
    """child_env without any cluster variables this process may have, plus ``extra``."""
    env = child_env(**extra)
    for name in CLUSTER_VARIABLES:
        if name not in extra:
            env.pop(name, None)
    return env


@needs_keras3_jax
def test_cli_cluster_keras3_on_tensorflow_refused_before_anything_starts(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    model_dir, log_dir = tmp_path / "model", tmp_path / "logs"
    code, out, err = cli("cluster", "fashion_mnist_mlp", "--engine", "keras3", "--workers", "1",
                         "--model-dir", model_dir, "--log-dir", log_dir, timeout=120,
                         env=cli_env(KERAS_BACKEND="tensorflow", TMPDIR=str(temp)))
    assert code == 2, (out, err)
    assert KERAS_ISSUE in err and "KERAS_BACKEND=jax" in err
    assert "Local cluster" not in out
    assert not model_dir.exists() and not log_dir.exists()
    # Nor the default log folder (tempfile.mkdtemp's cluster-NAME-*).
    code, out, err = cli("cluster", "fashion_mnist_mlp", "--engine", "keras3", "--workers", "1",
                         "--model-dir", model_dir, timeout=120,
                         env=cli_env(KERAS_BACKEND="tensorflow", TMPDIR=str(temp)))
    assert code == 2 and KERAS_ISSUE in err, (out, err)
    assert not [n for n in os.listdir(temp) if n.startswith("cluster-")]
    assert not model_dir.exists()


@needs_keras3_jax
def test_cli_train_partial_jaxjob_exits_2(tmp_path):
    model_dir, data_dir = tmp_path / "model", tmp_path / "data"
    code, out, err = cli("train", "fashion_mnist_mlp", "--engine", "keras3",
                         "--model-dir", model_dir, "--data-dir", data_dir, timeout=180,
                         env=cli_env(KERAS_BACKEND="jax", COORDINATOR_ADDRESS="127.0.0.1",
                                     NUM_PROCESSES="2"))
    assert code == 2, (out, err)
    missing = err.split("missing", 1)[-1]
    assert "COORDINATOR_PORT" in missing and "PROCESS_ID" in missing, err
    assert checkpoint_steps(model_dir) == [] and latest_step(model_dir) is None
    assert not data_dir.exists() or not os.listdir(data_dir)


def test_a_jax_release_whose_cpu_collectives_hang_is_refused_and_left_out_of_the_jax_extra():
    from packaging.requirements import Requirement  # pylint: disable=import-outside-toplevel
    for version in jax_processes.JAX_RELEASES_THAT_HANG:
        message = jax_processes.hang_refusal(version, "cpu")
        assert f"JAX {version}'s CPU collectives" in message
        assert f"pip install 'jax[cpu]!={version}'" in message
        # GPUs collect through NCCL, not gloo.
        assert jax_processes.hang_refusal(version, "gpu") == ""
    assert jax_processes.hang_refusal("0.12.0.1", "cpu") == ""
    setup_py = (pathlib.Path(ROOT) / "setup.py").read_text()
    found = re.search(r'"jax": \[f"([^";]+);', setup_py)
    assert found, "setup.py has no jax extra"
    wanted = Requirement(found.group(1))
    assert wanted.name == "jax"
    for version in jax_processes.JAX_RELEASES_THAT_HANG:
        assert not wanted.specifier.contains(version), (version, str(wanted))
    assert wanted.specifier.contains("0.12.0.1")
