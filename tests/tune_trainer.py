"""A stand-in for ``train`` in local studies: a real child process that
``tune`` starts, reads and signals like a trial, without TensorFlow.

It takes train's ``--model-dir``, ``--hparams`` and ``--evaluations-file``;
its hparams ``x`` (the final accuracy) and ``mode`` say what it does:

- ``ok``: records ``FAKE_EVALS`` evaluations (steps 1..N, accuracy
  ``x * step / 7``, ``FAKE_EVAL_PAUSE`` seconds apart), then exports;
  SIGTERM exits 75 at once, as train does once it saved its checkpoint;
- ``finish``: on SIGTERM trains on to its end and exports, exit 0, as train
  does when the signal lands after its last step;
- ``quit0``: exits 0 on SIGTERM, without an export;
- ``fail``, ``hang``, ``stubborn`` (ignores SIGTERM), ``nometric`` (an
  export without the metric).

Each run appends its PID to ``MODEL_DIR/calls.txt`` and each SIGTERM it gets
a line to ``MODEL_DIR/signals.txt``.
"""

import sys

import pytest

FAKE_TRAIN = """\
import json, os, signal, sys, time
args = sys.argv[1:]
model_dir = args[args.index("--model-dir") + 1]
hp = dict(i.split("=", 1) for i in args[args.index("--hparams") + 1].split(",") if i)
evals = args[args.index("--evaluations-file") + 1]
os.makedirs(model_dir, exist_ok=True)
with open(os.path.join(model_dir, "calls.txt"), "a") as f:
    f.write("%d\\n" % os.getpid())
mode = hp.get("mode", "ok")
signalled = []


def on_term(*_):
    with open(os.path.join(model_dir, "signals.txt"), "a") as f:
        f.write("SIGTERM\\n")
    if mode == "finish":
        signalled.append(True)
    else:
        sys.exit(0 if mode == "quit0" else 75)


signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "stubborn" else on_term)
if mode == "fail":
    sys.stderr.write("error: the stand-in trainer failed on purpose\\n")
    sys.exit(1)
if mode in ("hang", "stubborn"):
    time.sleep(60)
hold = os.environ.get("FAKE_HOLD")
if hold and float(hp.get("x", 0)) >= 0.5:
    deadline = time.time() + 30
    while os.path.exists(hold) and time.time() < deadline:
        time.sleep(0.05)
x = float(hp.get("x", 0))
# FAKE_EVALS: evaluations at steps 1..N, the metric x * step / 7; a pruned
# trial is told by SIGTERM between them.
for step in range(1, int(os.environ.get("FAKE_EVALS", "0")) + 1):
    with open(evals, "a") as f:
        f.write(json.dumps({"step": step, "time": time.time(),
                            "metrics": {"accuracy": x * step / 7.0}}) + "\\n")
    time.sleep(0 if signalled else float(os.environ.get("FAKE_EVAL_PAUSE", "0.3")))
os.makedirs(os.path.join(model_dir, "export"), exist_ok=True)
metrics = {"accuracy": x, "loss": 1.0, "global_step": 7}
if mode == "nometric":
    metrics.pop("accuracy")
with open(os.path.join(model_dir, "export", "export.json"), "w") as f:
    json.dump({"global_step": 7, "metrics": metrics}, f)
"""


@pytest.fixture
def fake_python(tmp_path):
    """An 'interpreter' that runs the stand-in trainer whatever module it is asked for."""
    script = tmp_path / "fake_train.py"
    script.write_text(FAKE_TRAIN)
    wrapper = tmp_path / "fake-python"
    wrapper.write_text("#!/bin/sh\nshift 2\nexec %s %s \"$@\"\n" % (sys.executable, script))
    wrapper.chmod(0o755)
    return str(wrapper)
