"""The model-dir lock: one training process per model dir, and a lock left
by a crash taken over by exactly one of the processes that find it.

The race test runs two real processes that start their takeover of the same
stale lock at the same instant, RACE_ROUNDS times.
"""

import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from support import ROOT, child_env
from estimator_keras.errors import ModelDirError
from estimator_keras.modeldir import LOCK_NAME, ModelDirLock

RACE_ROUNDS = 50
"""Rounds of two processes racing for one stale lock (the README's count)."""

# Reads "go DIR T0" / "release" / "quit" lines; at time T0 (both racers spin
# until then) it takes the lock of DIR and says "won" or "lost: why".
RACER = r'''
import sys, time
from estimator_keras.errors import ModelDirError
from estimator_keras.modeldir import ModelDirLock
lock = None
for line in sys.stdin:
    word, *rest = line.split()
    if word == "go":
        directory, t0 = rest[0], float(rest[1])
        while time.time() < t0:
            pass
        try:
            lock = ModelDirLock(directory).acquire()
            print("won", flush=True)
        except ModelDirError as e:
            lock = None
            print("lost:", str(e).split(";")[0], flush=True)
    elif word == "release":
        if lock is not None:
            lock.release()
        print("released", flush=True)
    else:
        break
'''


def dead_pid():
    """The pid of a process that has ended."""
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, timeout=30, check=True)
    return int(proc.stdout)


def write_stale_lock(directory, pid, host=None):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, LOCK_NAME), "w") as f:
        json.dump({"pid": pid, "host": host or socket.gethostname(), "time": 1.0}, f)


def test_two_processes_racing_for_a_stale_lock_one_wins_each_round(tmp_path):
    stale = dead_pid()
    racers = [subprocess.Popen([sys.executable, "-c", RACER], cwd=ROOT, env=child_env(),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
              for _ in range(2)]
    outcomes = []
    try:
        for round_ in range(RACE_ROUNDS):
            directory = str(tmp_path / f"run-{round_}")
            write_stale_lock(directory, stale)
            start = time.time() + 0.05
            for racer in racers:
                racer.stdin.write(f"go {directory} {start}\n")
                racer.stdin.flush()
            answers = [racer.stdout.readline().strip() for racer in racers]
            outcomes.append(answers)
            wins = sum(a == "won" for a in answers)
            assert wins == 1, f"round {round_}: {answers}"
            # The loser saw the winner, never the dead owner.
            loser = next(a for a in answers if a != "won")
            assert "in use by" in loser, loser
            for racer in racers:
                racer.stdin.write("release\n")
                racer.stdin.flush()
            assert [r.stdout.readline().strip() for r in racers] == ["released"] * 2
            assert not os.path.exists(os.path.join(directory, LOCK_NAME))
    finally:
        for racer in racers:
            try:
                racer.stdin.write("quit\n")
                racer.stdin.close()
            except OSError:
                pass
            try:
                racer.wait(timeout=10)
            except subprocess.TimeoutExpired:
                racer.kill()
                racer.wait(timeout=10)
    assert len(outcomes) == RACE_ROUNDS


def test_stale_lock_is_taken_over_with_a_warning(tmp_path, caplog):
    pid = dead_pid()
    write_stale_lock(tmp_path / "run", pid)
    with caplog.at_level(logging.WARNING, logger="estimator_keras.modeldir"):
        with ModelDirLock(tmp_path / "run") as lock:
            assert lock.held
            owner = json.load(open(tmp_path / "run" / LOCK_NAME))
            assert owner["pid"] == os.getpid()
    assert any(f"left by process {pid}" in r.getMessage() for r in caplog.records)
    assert not (tmp_path / "run" / LOCK_NAME).exists()


def test_live_holder_refuses_a_second_process(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", RACER], cwd=ROOT, env=child_env(), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    try:
        holder.stdin.write(f"go {tmp_path / 'run'} 0\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "won"
        with pytest.raises(ModelDirError) as info:
            ModelDirLock(tmp_path / "run").acquire()
        assert f"in use by process {holder.pid}" in str(info.value)
        assert "two training runs must not share a model dir" in str(info.value)
        # A crash frees the lock at once: the kernel drops the flock.
        holder.kill()
        holder.wait(timeout=10)
        with ModelDirLock(tmp_path / "run") as lock:
            assert lock.held
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)


def test_lock_of_another_host_is_refused_and_remote_dirs_are_not_locked(tmp_path):
    write_stale_lock(tmp_path / "run", 12345, host="some-other-host")
    with pytest.raises(ModelDirError, match="locked by process 12345 on host some-other-host"):
        ModelDirLock(tmp_path / "run").acquire()
    assert (tmp_path / "run" / LOCK_NAME).exists()
    lock = ModelDirLock("gs://bucket/run").acquire()
    assert not lock.held
    lock.release()
