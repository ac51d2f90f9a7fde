"""Table "shapes": shapes_unet's quality with its default settings.

``python -m experiments prepare shapes`` (8000 generated 64x64 training
images with per-pixel masks, 1000 held-out test images), then ``python -m
experiments train shapes_unet`` exactly as registered (batch 32, 3000
steps, learning rate 2e-3, evaluation every 1000 steps), then ``evaluate
--json`` of the final checkpoint: mean IoU and pixel accuracy on the test
split. Each command is a fresh process. ``--quick`` trains 60 steps on 400
images: a check that the section can be produced, not its numbers.
"""

import json
import os
import re

from benchmarks import common, output

TABLE = "shapes"
TITLE = "shapes_unet with its default settings: mean IoU and pixel accuracy (test split)"
EXPERIMENT = "shapes_unet"
TARGET_IOU = 0.8
TIMEOUT_S = 4 * 3600


def data_dir(settings):
    """Where shapes/ is (or gets) prepared: ``--data-dir`` when it is a folder
    of datasets, else a folder in the workdir."""
    base = str(settings.data_dir)
    if os.path.exists(os.path.join(base, "dataset.json")) or settings.quick:
        return os.path.join(settings.workdir, "shapes-data")
    return base


def run(settings, steps=None, examples=None):
    common.quiet_tensorflow()
    steps = steps or (60 if settings.quick else None)
    examples = examples or (400 if settings.quick else None)
    data = data_dir(settings)
    model_dir = os.path.join(settings.workdir, TABLE, "model")
    load_start = output.load_average()
    row = {"name": f"{EXPERIMENT} (defaults)" + (f", {steps} steps" if steps else "")}
    if not os.path.exists(os.path.join(data, "shapes", "dataset.json")):
        prepare = ["prepare", "shapes", "--data-dir", data]
        if examples:
            prepare += ["--max-examples", examples]
        rc, _, err, seconds = common.run_experiments(prepare, TIMEOUT_S)
        row["prepare_s"] = seconds
        if rc:
            row["error"] = f"prepare failed ({rc}): {err[-500:]}"
    if "error" not in row:
        train = ["train", EXPERIMENT, "--data-dir", data, "--model-dir", model_dir]
        if steps:
            train += ["--max-steps", steps, "--eval-every", max(1, steps // 3)]
        rc, _, err, seconds = common.run_experiments(train, TIMEOUT_S,
                                                     settings.python_estimator)
        row["train_s"] = seconds
        average = common.training_average(err)
        if average:
            row.update(steps=average[0], steps_per_s=average[1], examples_per_s=average[2])
        row["evaluations"] = [{"step": int(s), "mean_iou": float(v)} for s, v in re.findall(
            r"evaluated step (\d+): .*?mean_iou ([\d.]+)", err)]
        if rc:
            row["error"] = f"train failed ({rc}): {err[-500:]}"
    if "error" not in row:
        rc, out, err, seconds = common.run_experiments(
            ["evaluate", EXPERIMENT, "--data-dir", data, "--model-dir", model_dir, "--json"],
            TIMEOUT_S, settings.python_estimator)
        if rc:
            row["error"] = f"evaluate failed ({rc}): {err[-500:]}"
        else:
            metrics = json.loads(out[out.index("{"):])
            row.update(mean_iou=metrics.get("mean_iou"),
                       pixel_accuracy=metrics.get("pixel_accuracy"), loss=metrics.get("loss"),
                       global_step=metrics.get("global_step"), evaluate_s=seconds)
    targets = [common.target("shapes.mean_iou", f"{EXPERIMENT}: mean IoU on the test split, "
                             f"default settings", row.get("mean_iou"), TARGET_IOU,
                             why=row.get("error") or (f"only {steps} steps (--quick)"
                                                      if steps else None))]
    return {"table": TABLE, "title": TITLE, "unit": "", "rows": [row],
            "columns": ["name", "global_step", "mean_iou", "pixel_accuracy", "loss",
                        "steps_per_s", "train_s"],
            "targets": targets, "data_dir": data, "load_before": load_start,
            "load_after": output.load_average(),
            "notes": ["train_s: the whole `train` command (TensorFlow start, evaluations "
                      "and export included); steps_per_s: its progress lines' average"]}
