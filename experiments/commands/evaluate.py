"""``evaluate``: the metrics of a model dir's latest checkpoint."""

import json

from estimator_keras import manifest
from experiments.catalog import datasets
from experiments.commands.common import (data_dir, experiment_config, model_dirs,
                                         tensorflow_module)


def describe_evaluation(evaluated):
    """"test split, 10,000 examples, checkpoint step 6000"."""
    parts = [f"{evaluated['split']} split"]
    if evaluated.get("examples"):
        parts.append(f"{evaluated['examples']:,} examples")
    if evaluated.get("step") is not None:
        parts.append(f"checkpoint step {evaluated['step']}")
    return ", ".join(parts)


def run(args):
    train = tensorflow_module("experiments.training.run")
    experiment, config = experiment_config(args)
    model_dir = model_dirs(args)[0]
    metrics = train.evaluate(experiment, config, model_dir=model_dir,
                             data_dir=data_dir(args), engine=args.engine)
    if args.json:
        print(json.dumps(metrics, indent=2, sort_keys=True))
        return 0
    path, _ = datasets.find(config.data.dataset, data_dir(args))
    evaluated = {"split": config.data.eval_split, "step": metrics.get("global_step"),
                 "examples": manifest.load_manifest(path).splits[
                     config.data.eval_split].num_examples}
    print(f"evaluated {model_dir} ({describe_evaluation(evaluated)}):")
    for key, value in sorted(metrics.items()):
        if key != "global_step":
            print(f"  {key:<16} {value:.4f}")
    return 0
