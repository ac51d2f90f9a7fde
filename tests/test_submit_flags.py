"""`submit` takes every flag of `train` and hands each to the job's `train`
(one list of train's flags: experiments/config/flags.py). No network, no cloud."""

import json

import pytest

from experiments import cli
from support import sample_flag_value

JOB_DIR = "gs://my-bucket/run1"
VERTEX = ["--project", "my-project-123", "--region", "us-central1", "--job-dir", JOB_DIR,
          "--display-name", "flags", "--container-image", "gcr.io/p/ek:1"]
# Values that submit accepts and that differ from train's defaults; any other
# flag gets one made from its kind (_sample).
KNOWN = {"--data-dir": "gs://my-bucket/data", "--config": "gs://my-bucket/config/c.yaml",
         "--strategy": "mirrored", "--engine": "keras", "--hparams": "dense_units=64",
         "--hypertune-metric": "accuracy", "--dataset": "fashion_mnist",
         "--track": "https://mlflow.example.com:5000", "--register": "fashion"}


def _subcommand_parser(command):
    # argparse offers no public listing of a parser's subcommands or actions.
    for action in cli.build_parser()._actions:  # pylint: disable=protected-access
        if isinstance(action.choices, dict) and command in action.choices:
            return action.choices[command]
    raise AssertionError("no subcommand %r" % command)


def _train_args(argv):
    """The namespace ``python -m experiments ARGV`` hands ``train``, without training."""
    seen = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(cli.COMMANDS, "train", lambda args: seen.append(args) or 0)
        assert cli.main(list(argv)) == 0, argv
    return seen[0]


def _job_argvs(capsys, argv):
    """Each worker pool's arguments after ``python -m experiments`` in the
    request that ``submit ARGV --dry-run`` prints."""
    assert cli.main(["submit", "fashion_mnist_cnn", *argv, "--dry-run"]) == 0, argv
    request = json.loads(capsys.readouterr().out.partition("\n\n")[0])
    spec = request.get("trialJobSpec") or request["jobSpec"]
    return [pool["containerSpec"]["args"] for pool in spec["workerPoolSpecs"] if pool]


def test_every_train_flag_is_accepted_by_submit_and_reaches_the_job(capsys, tmp_path):
    plugin = tmp_path / "nothing_registered.py"
    plugin.write_text("# a plugin that registers nothing\n")
    known = {**KNOWN, "--module": str(plugin)}
    baseline = _train_args(["train", "fashion_mnist_cnn"])
    checked = []
    for action in _subcommand_parser("train")._actions:  # pylint: disable=protected-access
        if not action.option_strings or "--help" in action.option_strings:
            continue
        flag, value = sample_flag_value(action, known)
        if flag == "--register":  # registers what --track records
            value += ["--track", known["--track"]]
        if flag == "--model-dir":  # --job-dir says where the job writes
            assert cli.main(["submit", "fashion_mnist_cnn", *VERTEX, flag, "gs://b/m",
                             "--dry-run"]) == 2
            assert "--job-dir" in capsys.readouterr().err
            checked.append(flag)
            continue
        given = _train_args(["train", "fashion_mnist_cnn", flag, *value])
        dest = "modules" if flag == "--module" else action.dest
        assert getattr(given, dest) != getattr(baseline, dest), (flag, "sample is the default")

        job_argvs = _job_argvs(capsys, VERTEX + [flag, *value])
        assert job_argvs, flag
        for job_argv in job_argvs:
            assert job_argv[job_argv.index("train"):][:2] == ["train", "fashion_mnist_cnn"]
            received = _train_args(job_argv)
            assert getattr(received, dest) == getattr(given, dest), (flag, job_argv)
        checked.append(flag)
    # The flags this test was written with are among those it found.
    assert {"--config", "--dataset", "--strategy", "--engine", "--skip-corrupt", "--module",
            "--preemption-grace", "--source-dir", "--tuning-trial", "--verbose",
            "--model-dir", "--data-dir", "--max-steps"} <= set(checked), checked


def test_tuning_trials_get_train_flags_and_tune_sets_the_trial_ones(capsys, tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("learning_rate: {type: double, min: 0.001, max: 0.1, scale: log}\n")
    tune = VERTEX + ["--tune", str(space), "--max-trials", "2"]
    (job_argv,) = _job_argvs(capsys, tune + ["--skip-corrupt", "--preemption-grace", "7"])
    assert job_argv[-3:-1] == ["--tuning-trial", "--hypertune-metric"]
    received = _train_args(job_argv)
    assert (received.skip_corrupt, received.preemption_grace) == (True, 7.0)
    for extra in (["--tuning-trial"], ["--hypertune-metric", "loss"]):
        assert cli.main(["submit", "fashion_mnist_cnn", *tune, *extra, "--dry-run"]) == 2
        err = capsys.readouterr().err
        assert extra[0] in err and "--metric" in err, err


@pytest.mark.parametrize("flag", ["--max-steps", "--batch-size", "--eval-every"])
def test_submit_refuses_a_count_the_job_would_refuse(flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["submit", "fashion_mnist_cnn", *VERTEX, flag, "0", "--dry-run"])
    assert exit_info.value.code == 2
    assert "expected a whole number > 0" in capsys.readouterr().err


def test_submit_refuses_a_grace_period_the_job_would_refuse(capsys):
    assert cli.main(["submit", "fashion_mnist_cnn", *VERTEX, "--preemption-grace", "0",
                     "--dry-run"]) == 2
    assert "--preemption-grace must be a positive number" in capsys.readouterr().err
