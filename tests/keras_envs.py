"""The interpreters of the four (engine, Keras) pairs, for tests that move
weights and checkpoints between them in child processes.

Each pair runs in its own Python: ``estimator`` (TensorFlow 2.15 with
tf.estimator, its own Keras 2), ``keras`` (TensorFlow 2.16+ with tf-keras,
``TF_USE_LEGACY_KERAS=1``), ``keras3-tensorflow`` and ``keras3-jax``
(Keras 3 on that backend). The interpreter of each is taken from
``ESTIMATOR_KERAS_PYTHON_ESTIMATOR`` / ``..._KERAS`` / ``..._KERAS3`` when
set, else the first of this interpreter and the tox envs that have its
packages (``py311``, ``py313``, ``keras``; of this tree, then of the tree
tox runs from); a pair with none is skipped, with the reason. CI runs these
tests in the keras env, the last of tox's envlist, when all three exist.
"""

import functools
import json
import os
import subprocess
import sys

import pytest

from support import ROOT, child_env

PAIRS = ("estimator", "keras", "keras3-tensorflow", "keras3-jax")

_PROBE = """
import importlib.metadata as m, importlib.util as u, json
versions = {(d.metadata["Name"] or "").lower().replace("_", "-"): d.version
            for d in m.distributions()}
tf = next((versions[n] for n in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu")
           if n in versions), None)
print(json.dumps({"tf": tf, "estimator": u.find_spec("tensorflow_estimator") is not None,
                  "tf_keras": u.find_spec("tf_keras") is not None,
                  "keras": versions.get("keras"), "jax": u.find_spec("jax") is not None}))
"""


def _fits(pair, facts):
    tf_minor = tuple(int(p) for p in (facts["tf"] or "0.0").split(".")[:2])
    keras3 = (facts["keras"] or "0").split(".")[0] == "3"
    return {"estimator": facts["estimator"] and tf_minor <= (2, 15),
            "keras": facts["tf_keras"] and tf_minor >= (2, 16),
            "keras3-tensorflow": keras3 and tf_minor >= (2, 16),
            "keras3-jax": keras3 and tf_minor >= (2, 16) and facts["jax"]}[pair]


@functools.lru_cache(maxsize=None)
def _facts(python):
    try:
        proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True,
                              timeout=60, env=child_env())
    except (OSError, subprocess.TimeoutExpired):
        return None
    return json.loads(proc.stdout) if proc.returncode == 0 else None


# The tox envs (tox.ini) that have each pair's packages.
_TOX_ENVS = {"estimator": ("py311",), "keras": ("keras",), "keras3-tensorflow": ("py313", "keras"),
             "keras3-jax": ("keras",)}


def _candidates(pair):
    variable = "ESTIMATOR_KERAS_PYTHON_" + {"estimator": "ESTIMATOR", "keras": "KERAS"}.get(
        pair, "KERAS3")
    if os.environ.get(variable):
        return [os.environ[variable]], variable
    roots = [ROOT] + ([os.environ["TOX_WORK_DIR"]] if os.environ.get("TOX_WORK_DIR") else [])
    found = [sys.executable]
    for root in roots:
        base = root if root.endswith(".tox") else os.path.join(root, ".tox")
        found += [os.path.join(base, tox, "bin", "python") for tox in _TOX_ENVS[pair]]
    return [p for p in found if os.path.exists(p)], variable


def interpreter(pair):
    """(python, environment) for the pair's child processes; pytest.skip
    when this machine has no interpreter for it."""
    candidates, variable = _candidates(pair)
    for python in candidates:
        facts = _facts(python)
        if facts and _fits(pair, facts):
            # Set for every pair: a test run from the keras env has it at 1,
            # which TensorFlow 2.15 without tf-keras cannot honour.
            extra = {"estimator": {"TF_USE_LEGACY_KERAS": "0"},
                     "keras": {"TF_USE_LEGACY_KERAS": "1"},
                     "keras3-tensorflow": {"TF_USE_LEGACY_KERAS": "0",
                                           "KERAS_BACKEND": "tensorflow"},
                     "keras3-jax": {"TF_USE_LEGACY_KERAS": "0", "KERAS_BACKEND": "jax"}}[pair]
            return python, child_env(PYTHONHASHSEED="0", **extra)
    pytest.skip(f"no interpreter for the {pair} pair (tried {candidates or 'none'}; set "
                f"{variable} to a Python with "
                + {"estimator": "TensorFlow 2.15 and tensorflow-estimator",
                   "keras": "TensorFlow 2.16+ and tf-keras",
                   "keras3-tensorflow": "TensorFlow 2.16+ and Keras 3",
                   "keras3-jax": "TensorFlow 2.16+, Keras 3 and JAX"}[pair] + ")")
    return None  # not reached: skip raises


def run(pair, script, *args, timeout=600):
    """Runs ``script`` (Python source) with the pair's interpreter from the
    repository root; returns its stdout, failing the test on a non-zero exit."""
    python, env = interpreter(pair)
    proc = subprocess.run([python, "-c", script, *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{pair} child failed:\n{proc.stderr[-4000:]}"
    return proc.stdout


def once_per_pair(make):
    """A getter that skips a pair without an interpreter, else returns
    ``make(pair)``, computed once per pair."""
    cache = {}

    def get(pair):
        interpreter(pair)  # skips a missing pair with the reason
        if pair not in cache:
            cache[pair] = make(pair)
        return cache[pair]

    return get
