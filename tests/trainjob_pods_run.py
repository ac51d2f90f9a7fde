"""Runs a TrainJob's pods as local processes, each with exactly the
environment Kubeflow Trainer gives it and a network of its own, as pods have:
inside a private user, mount and network namespace (``unshare --user
--map-root-user --mount --net``), each pod gets a network namespace with one
address on a bridge (iproute2's ``ip``), and the job's host names point at
those addresses through a hosts file mounted over /etc/hosts. Nothing outside
the namespace sees the processes, the network or the file.

    unshare --user --map-root-user --mount --net python trainjob_pods_run.py PLAN

PLAN is a JSON file: {"hosts": [names], "pods": [{"env": {...}, "argv":
[...], "hostname": name, "log": path}], "timeout": seconds, "result": path}. Every pod runs
with ``env`` as its whole environment, is killed with its runner, and is
SIGKILLed by PID at the timeout. The result file gets each pod's exit status
(None: killed at the timeout).
"""

import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from estimator_keras.distribute import netns  # noqa: E402


SET_HOSTNAME = ("import os, socket, sys; socket.sethostname(sys.argv[1]); "
                "os.execvpe(sys.argv[2], sys.argv[2:], os.environ)")


def _run(*argv):
    subprocess.run(argv, check=True, timeout=30)


def _pod_networks(count):
    """A network namespace per pod, each with one address on a shared bridge;
    returns the addresses."""
    netns.loopback_up()
    os.makedirs("/run/netns", exist_ok=True)
    _run("mount", "-t", "tmpfs", "tmpfs", "/run/netns")
    _run("ip", "link", "add", "pods", "type", "bridge")
    _run("ip", "link", "set", "pods", "up")
    addresses = []
    for index in range(count):
        name, address = f"pod{index}", f"10.77.0.{index + 1}"
        _run("ip", "netns", "add", name)
        _run("ip", "link", "add", f"veth{index}", "type", "veth", "peer", "name", "eth0",
             "netns", name)
        _run("ip", "link", "set", f"veth{index}", "master", "pods")
        _run("ip", "link", "set", f"veth{index}", "up")
        _run("ip", "-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
        _run("ip", "-n", name, "link", "set", "eth0", "up")
        _run("ip", "-n", name, "link", "set", "lo", "up")
        addresses.append(address)
    return addresses


def main(plan_path):
    with open(plan_path) as f:
        plan = json.load(f)
    addresses = _pod_networks(len(plan["pods"]))
    with tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False) as hosts:
        hosts.write("127.0.0.1 localhost\n")
        hosts.write("".join(f"{address} {name} {pod['hostname']}\n"
                            for address, name, pod in zip(addresses, plan["hosts"],
                                                          plan["pods"])))
    _run("mount", "--bind", hosts.name, "/etc/hosts")
    procs = []
    for index, pod in enumerate(plan["pods"]):
        with open(pod["log"], "w") as log:
            # A network and a host name of its own, as a pod has: gloo (JAX's
            # CPU collectives) looks its own host name up.
            argv = ["nsenter", f"--net=/run/netns/pod{index}", "unshare", "--uts",
                    sys.executable, "-c", SET_HOSTNAME, pod["hostname"]] + pod["argv"]
            procs.append(subprocess.Popen(argv, env=pod["env"], stdout=log,
                                          stderr=subprocess.STDOUT, cwd=pod.get("cwd"),
                                          preexec_fn=netns.die_with_parent()))
    deadline = time.monotonic() + plan["timeout"]
    codes = [None] * len(procs)
    while time.monotonic() < deadline and None in codes:
        codes = [p.poll() for p in procs]
        time.sleep(0.2)
    for proc, code in zip(procs, codes):
        if code is None:
            proc.kill()
            proc.wait(timeout=30)
    with open(plan["result"], "w") as f:
        json.dump({"returncodes": codes, "pids": [p.pid for p in procs]}, f)
    os.unlink(hosts.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
