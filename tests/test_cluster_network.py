"""The local cluster's network: its tasks share one private network namespace
that has only loopback, so their TensorFlow servers (which listen on every
interface) cannot be reached from this machine's own network, let alone from
other machines; where no namespace can be made the launcher says why and
uses this machine's network.

Each test checks what a connect() from this process (the host's namespace)
gets while the tasks listen, read from the kernel's own socket tables of the
tasks' namespace (/proc/PID/net/tcp*), and that nothing outlives the run.
"""

import http.server
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import test_cluster
from support import ROOT, child_env
from estimator_keras.distribute import launcher
from estimator_keras.distribute.launcher import launch_local_cluster


def _user_namespaces_allowed():
    unshare = shutil.which("unshare")
    return unshare is not None and subprocess.run(
        [unshare, "--user", "--map-root-user", "true"], capture_output=True,
        timeout=10).returncode == 0


def _private_allowed():
    """Whether this machine lets this user make a network namespace (the
    util-linux tool answers, independently of the code under test)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    flags = [["--net"], ["--user", "--map-root-user", "--net"]]
    return any(subprocess.run([unshare, *f, "true"], capture_output=True,
                              timeout=10).returncode == 0 for f in flags)


needs_netns = pytest.mark.skipif(not _private_allowed(),
                                 reason="this system allows this user no network namespace")


def listening_ports(pid):
    """TCP ports in LISTEN state in the network namespace of process ``pid``."""
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state = row.split()[1], row.split()[3]
            if state == "0A":
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def connect_from_here(port):
    """What a connect() to 127.0.0.1:port from this process's namespace gets."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        try:
            s.connect(("127.0.0.1", port))
        except OSError as e:
            return type(e).__name__
    return "connected"


# Stand-in tasks that listen as TensorFlow's servers do (0.0.0.0 on their
# TF_CONFIG port), reach each other over 127.0.0.1, and then wait for the
# file OUT/stop, or with "--all" for every task to have reached the others.
SERVER = r'''
import json, os, socket, sys, time
config = json.loads(os.environ["TF_CONFIG"])
me = "%s-%s" % (config["task"]["type"], config["task"]["index"])
out = sys.argv[1]
addresses = {"%s-%d" % (t, i): a for t, l in config["cluster"].items() for i, a in enumerate(l)}
server = socket.create_server(("0.0.0.0", int(addresses[me].rsplit(":", 1)[1])))
reached = []
for name, address in sorted(addresses.items()):
    host, port = address.rsplit(":", 1)
    for _ in range(200):  # until that task listens
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
            reached.append(name)
            break
        except ConnectionRefusedError:
            time.sleep(0.05)
info = {"pid": os.getpid(), "port": server.getsockname()[1], "reached": reached,
        "netns": os.readlink("/proc/self/ns/net"), "uid": os.getuid()}
with open(os.path.join(out, me + ".tmp"), "w") as f:
    json.dump(info, f)
os.rename(os.path.join(out, me + ".tmp"), os.path.join(out, me + ".json"))
def done():
    if sys.argv[2:] == ["--all"]:
        return all(os.path.exists(os.path.join(out, n + ".json")) for n in addresses)
    return os.path.exists(os.path.join(out, "stop"))
while not done():
    time.sleep(0.05)
'''


def _ready(out, names, bound=30.0):
    end = time.monotonic() + bound
    while True:
        found = {n: out / f"{n}.json" for n in names}
        if all(p.exists() for p in found.values()):
            return {n: json.loads(p.read_text()) for n, p in found.items()}
        assert time.monotonic() < end, f"not ready: {sorted(n for n, p in found.items() if not p.exists())}"
        time.sleep(0.05)


def _servers(tmp_path, *flags):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    out = tmp_path / "out"
    out.mkdir()
    return [sys.executable, str(script), str(out), *flags], out


@needs_netns
def test_tasks_listen_only_inside_one_private_namespace(tmp_path):
    command, out = _servers(tmp_path)
    seen = {}

    def probe_then_stop():
        try:
            tasks = _ready(out, ["chief-0", "worker-0", "ps-0"])
            seen["tasks"] = tasks
            seen["from_here"] = {n: connect_from_here(t["port"]) for n, t in tasks.items()}
            seen["listening"] = {n: t["port"] in listening_ports(t["pid"])
                                 for n, t in tasks.items()}
        finally:
            (out / "stop").touch()

    import threading  # pylint: disable=import-outside-toplevel
    prober = threading.Thread(target=probe_then_stop, daemon=True)
    prober.start()
    # The ps never exits by itself: the launcher ends it once chief and worker did.
    result = test_cluster.launch(command, workers=1, ps=1, log_dir=tmp_path / "logs")
    prober.join(timeout=10)
    tasks = seen["tasks"]
    # Each task listened on its port, which nothing here can connect to ...
    assert seen["listening"] == {n: True for n in tasks}
    assert seen["from_here"] == {n: "ConnectionRefusedError" for n in tasks}, seen
    assert result.network == "private"
    assert result.returncodes["chief-0"] == 0 and result.returncodes["worker-0"] == 0
    # ... and every task reached every other one (itself included) over 127.0.0.1 ...
    assert all(t["reached"] == ["chief-0", "ps-0", "worker-0"] for t in tasks.values()), tasks
    # ... in the one namespace they share, which is not this process's.
    assert len({t["netns"] for t in tasks.values()}) == 1
    assert tasks["chief-0"]["netns"] != os.readlink("/proc/self/ns/net")
    # The tasks keep the launcher's user, and launcher's pids are theirs.
    assert {t["uid"] for t in tasks.values()} == {os.getuid()}
    assert {n: t["pid"] for n, t in tasks.items()} == result.pids
    test_cluster.assert_gone(result.pids)


def test_network_host_keeps_this_machines_network(tmp_path, caplog):
    command, out = _servers(tmp_path, "--all")
    with caplog.at_level("WARNING", logger=launcher.__name__):
        result = test_cluster.launch(command, workers=1, log_dir=tmp_path / "logs",
                                     network="host")
    assert result.network == "host" and result.returncodes == {"chief-0": 0, "worker-0": 0}
    tasks = _ready(out, ["chief-0", "worker-0"], bound=1)
    assert {t["netns"] for t in tasks.values()} == {os.readlink("/proc/self/ns/net")}
    assert all(t["reached"] == ["chief-0", "worker-0"] for t in tasks.values()), tasks
    assert launcher.ALL_INTERFACES_WARNING in caplog.messages


def test_network_argument_errors(tmp_path):
    with pytest.raises(launcher.UsageError, match="network must be one of auto, private, host"):
        launch_local_cluster([sys.executable], network="none", log_dir=tmp_path)
    with pytest.raises(launcher.UsageError, match="host must be a loopback address"):
        launch_local_cluster([sys.executable], network="private", host="10.1.2.3",
                             log_dir=tmp_path)


# A launcher that is killed outright (SIGKILL) cannot stop its tasks itself.
KILLED_LAUNCHER = r'''
import json, logging, sys
from estimator_keras.distribute import launcher
logging.basicConfig(level=logging.INFO)
launcher.launch_local_cluster(json.loads(sys.argv[1]), workers=1, ps=1, log_dir=sys.argv[2],
                              timeout=60, echo=False)
'''


@needs_netns
def test_a_killed_launcher_leaves_no_task_behind(tmp_path):
    command, out = _servers(tmp_path)
    driver = subprocess.Popen([sys.executable, "-c", KILLED_LAUNCHER, json.dumps(command),
                               str(tmp_path / "logs")], cwd=ROOT, env=child_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        tasks = _ready(out, ["chief-0", "worker-0", "ps-0"])
    finally:
        driver.kill()
        err = driver.communicate(timeout=30)[1].decode()
    pids = {n: t["pid"] for n, t in tasks.items()}
    end = time.monotonic() + 10
    while any(os.path.exists(f"/proc/{p}") for p in pids.values()) and time.monotonic() < end:
        time.sleep(0.05)
    test_cluster.assert_gone(pids)
    assert "private network namespace" in err, err


# The launcher in a user namespace whose kernel limits allow no further
# network or user namespace (/proc/sys/user/max_*_namespaces, which the root
# of a user namespace may lower for it): the kernel itself refuses.
NO_NAMESPACES = r'''
import json, logging, sys
for kind in ("net", "user"):
    with open("/proc/sys/user/max_%s_namespaces" % kind, "w") as f:
        f.write("0")
from estimator_keras.distribute import launcher
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
command, log_dir = json.loads(sys.argv[1]), sys.argv[2]
try:
    launcher.launch_local_cluster(command, workers=0, log_dir=log_dir + "-private",
                                  timeout=20, echo=False, network="private")
except launcher.ClusterError as e:
    print("private refused:", e, file=sys.stderr)
result = launcher.launch_local_cluster(command, workers=1, log_dir=log_dir, timeout=20,
                                       echo=False, kill_grace=1)
print(json.dumps({"network": result.network, "returncodes": result.returncodes,
                  "pids": result.pids}))
'''


@pytest.mark.skipif(not _user_namespaces_allowed(),
                    reason="the test needs a user namespace to lower the kernel's limits in")
def test_fallback_when_the_kernel_refuses_says_why(tmp_path):
    command, out = _servers(tmp_path, "--all")
    proc = subprocess.run(
        [shutil.which("unshare"), "--user", "--map-root-user", sys.executable, "-c",
         NO_NAMESPACES, json.dumps(command), str(tmp_path / "logs")],
        cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["network"] == "host" and result["returncodes"] == {"chief-0": 0, "worker-0": 0}
    err = re.sub(r"\s+", " ", proc.stderr)
    # The warning says that it fell back, why (the kernel's answer), and what that means.
    assert "WARNING: the tasks run in this machine's network, not in a private network " \
           "namespace, because it cannot be made here" in err
    assert "the namespace limit is reached" in err
    assert "anyone who can reach this machine's ports can run TensorFlow operations as you" in err
    assert "private refused: network 'private': cannot give the tasks a private network " \
           "namespace: unshare(CLONE_NEWNET) failed" in err
    tasks = _ready(out, ["chief-0", "worker-0"], bound=1)
    assert len({t["netns"] for t in tasks.values()}) == 1
    assert all(t["reached"] == ["chief-0", "worker-0"] for t in tasks.values()), tasks
    test_cluster.assert_gone({n: t["pid"] for n, t in tasks.items()})


# --------------------------------------------------------------------------- real training

@pytest.mark.slow
@needs_netns
def test_a_real_cluster_trains_while_its_ports_are_unreachable(fashion_data, tmp_path):
    model_dir = tmp_path / "model"
    out_path = tmp_path / "launcher.out"
    max_steps = 100
    command = [sys.executable, "-m", "experiments", "cluster", "fashion_mnist_mlp", "--workers",
               "1", "--model-dir", str(model_dir), "--log-dir", str(tmp_path / "logs"),
               "--timeout", "150", "--quiet", "--data-dir", str(fashion_data), "--max-steps",
               str(max_steps), "--batch-size", "32", "--strategy", "multi_worker_mirrored"]
    with open(out_path, "w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=child_env(PYTHONHASHSEED="0"),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    probes, pids = {}, {}
    try:
        deadline = time.monotonic() + 150
        while len(probes) < 2:
            assert proc.poll() is None, "cluster ended first:\n" + out_path.read_text()[-3000:]
            assert time.monotonic() < deadline, out_path.read_text()[-3000:]
            text = out_path.read_text()
            found = re.search(r"Local cluster (\{.*?\}) *[;+]", text)
            pids = {n: int(p) for n, p in re.findall(r"Started (\w+-\d+) \(pid (\d+)\)", text)}
            if found and {"chief-0", "worker-0"} <= set(pids):
                spec = json.loads(found.group(1))
                ports = {"chief-0": spec["chief"][0], "worker-0": spec["worker"][0]}
                for name, address in ports.items():
                    port = int(address.rsplit(":", 1)[1])
                    # Once TensorFlow's server listens in the task's namespace.
                    if name not in probes and port in listening_ports(pids[name]):
                        probes[name] = connect_from_here(port)
            time.sleep(0.02)
        returncode = proc.wait(timeout=max(1, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=40)
        test_cluster.assert_gone(pids)
    text = out_path.read_text()
    assert probes == {"chief-0": "ConnectionRefusedError", "worker-0": "ConnectionRefusedError"}
    assert returncode == 0, text[-3000:]
    assert launcher.PRIVATE_NETWORK_NOTE in re.sub(r"\s+", " ", text)
    assert "in a private network namespace (loopback only):" in text
    chief = (tmp_path / "logs" / "chief-0.log").read_text()
    assert "strategy multi_worker_mirrored" in chief and "(2 replica(s))" in chief, chief[-2000:]
    assert (model_dir / f"model.ckpt-{max_steps}.index").exists(), os.listdir(model_dir)


def test_cli_network_flag_and_remote_paths(monkeypatch, tmp_path, caplog):
    from experiments.commands import cluster as cluster_cmd  # pylint: disable=import-outside-toplevel
    calls = []

    def fake_launch(command, **kwargs):
        calls.append(kwargs["network"])
        return launcher.ClusterResult({"chief-0": 0}, {"chief-0": "c.log"}, {"chief-0": 1}, (),
                                      1.0, str(tmp_path), kwargs["network"])

    monkeypatch.setattr(cluster_cmd.launcher, "launch_local_cluster", fake_launch)
    monkeypatch.setattr(cluster_cmd, "_check_engine", lambda args, command: None)

    def run(*argv):
        args, extra = test_cluster.parse_cli(["cluster", "mnist_cnn", "--workers", "0",
                                              "--log-dir", str(tmp_path), *argv])
        return cluster_cmd.run(args, extra)

    run("--model-dir", "d")
    run("--model-dir", "d", "--network", "host")
    run("--model-dir", "d", "--network", "private")
    with caplog.at_level("WARNING"):
        run("--model-dir", "gs://bucket/run")  # a private namespace could not reach it
    assert calls == ["auto", "host", "private", "host"]
    assert "need the network for gs://bucket/run" in caplog.text
    with pytest.raises(launcher.UsageError, match="--network private leaves the tasks only "
                                                  "loopback, but they need the network for "
                                                  "gs://bucket/run"):
        run("--model-dir", "gs://bucket/run", "--network", "private")
    with pytest.raises(SystemExit):
        test_cluster.parse_cli(["cluster", "mnist_cnn", "--workers", "0", "--model-dir", "d",
                                "--network", "none"])
    assert len(calls) == 4


def test_the_namespace_helper_needs_only_the_standard_library():
    # It runs as `python -I netns.py`, where this package is not importable.
    code = textwrap.dedent("""
        import ast, sys
        tree = ast.parse(open(sys.argv[1]).read())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                 for a in n.names}
        names |= {n.module.split(".")[0] for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom) and n.module}
        print(sorted(names - set(sys.stdlib_module_names)))
    """)
    path = os.path.join(ROOT, "estimator_keras", "distribute", "netns.py")
    proc = subprocess.run([sys.executable, "-I", "-c", code, path], capture_output=True,
                          text=True, timeout=30)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


@needs_netns
def test_tasks_can_bind_the_address_their_host_name_resolves_to(tmp_path):
    # What binds by host name (JAX's gloo collectives) must find that address
    # in a namespace that has only loopback, whatever this machine's name
    # resolves to outside it.
    code = textwrap.dedent("""
        import socket
        name = socket.gethostname()
        address = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)[0][4][0]
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family) as s:
            s.bind((address, 0))
        print("bound", name, address, flush=True)
    """)
    result = launch_local_cluster([sys.executable, "-c", code], workers=0,
                                  log_dir=tmp_path / "logs", network="private", timeout=60)
    assert result.network == "private"
    log = (tmp_path / "logs" / "chief-0.log").read_text()
    assert re.search(r"^bound localhost (127\.\d+\.\d+\.\d+|::1)$", log, re.M), log


# --------------------------------------------------------------------------- data before the namespace

# A user's dataset that is downloaded: from the URL in EK_SERVED_URL, which
# the test serves on this machine's loopback, outside any namespace.
SERVED_MODULE = '''import io, os, urllib.request
import numpy as np
from experiments import (DataConfig, Experiment, ExperimentConfig, TrainConfig, register,
                         register_dataset)

def served(source_dir=None, download_dir=None):
    with urllib.request.urlopen(os.environ["EK_SERVED_URL"], timeout=20) as response:
        arrays = np.load(io.BytesIO(response.read()))
        return {split: {"image": arrays[split + "_image"], "label": arrays[split + "_label"]}
                for split in ("train", "test")}

register_dataset("ek_served", "6x6 grey images, downloaded", served,
                 labels={"label": {"num_classes": 2}})

def dense(hparams, data):
    import tensorflow as tf
    inputs = tf.keras.Input(shape=data.input_shape, name=data.input_name)
    x = tf.keras.layers.Flatten()(tf.keras.layers.Rescaling(1 / 255)(inputs))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(2, activation="softmax")(x))

register(Experiment(
    config=ExperimentConfig(
        name="ek_served_dense", description="a dense net on a downloaded dataset",
        data=DataConfig(dataset="ek_served"),
        train=TrainConfig(batch_size=16, max_steps=10, eval_every_steps=10, log_every_steps=10)),
    build_model=dense))
'''


def _served_archive():
    rng = np.random.default_rng(4)
    arrays = {}
    for split, n in (("train", 96), ("test", 32)):
        arrays[split + "_label"] = rng.integers(0, 2, n)
        arrays[split + "_image"] = rng.integers(0, 256, (n, 6, 6, 1)).astype(np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


@pytest.mark.slow
@needs_netns
def test_a_dataset_to_download_is_prepared_before_the_tasks_enter_the_namespace(tmp_path):
    body, requests = _served_archive(), []

    class Serve(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # pylint: disable=invalid-name  (the handler's API)
            requests.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Serve)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    module = tmp_path / "ek_served_plugin.py"
    module.write_text(SERVED_MODULE)
    data_dir, model_dir = tmp_path / "data", tmp_path / "model"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "experiments", "--module", str(module), "cluster",
             "ek_served_dense", "--workers", "0", "--network", "private", "--quiet",
             "--model-dir", str(model_dir), "--log-dir", str(tmp_path / "logs"),
             "--timeout", "240", "--data-dir", str(data_dir), "--engine", "estimator"],
            cwd=ROOT, capture_output=True, text=True, timeout=300,
            env=child_env(EK_SERVED_URL=f"http://127.0.0.1:{server.server_port}/served.npz"))
    finally:
        server.shutdown()
        server.server_close()
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    # Fetched once, by the launcher (the chief, inside the namespace, could
    # not reach this server), before the cluster started.
    assert requests == ["/served.npz"], requests
    preparing = text.index("Dataset ek_served is not in")
    assert preparing < text.index("Local cluster for 'ek_served_dense'"), text[-3000:]
    assert "in a private network namespace (loopback only):" in text
    assert (data_dir / "ek_served" / "dataset.json").exists()
    assert (model_dir / "model.ckpt-10.index").exists(), os.listdir(model_dir)
