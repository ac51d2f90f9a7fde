"""``train``: trains (preparing the data if missing), evaluates and exports
an experiment; the training run itself is :mod:`experiments.training.run`,
imported here only, so that the commands without TensorFlow start at once."""

import os

from estimator_keras.engines.base import duration, format_metrics
from estimator_keras.errors import UsageError
from experiments.commands.common import data_dir, model_dirs, tensorflow_module, train_config
from experiments.commands.evaluate import describe_evaluation
from experiments.commands.export import print_export
from experiments.tuning import evaluations


def trial_hparams(extra):
    """The ``--name=value`` / ``--name value`` arguments a tuning service
    appends to a trial's command, as ``--hparams`` text."""
    items, rest = [], list(extra)
    while rest:
        arg = rest.pop(0)
        if not arg.startswith("--") or arg == "--":
            raise UsageError(f"a tuning trial's extra argument {arg!r} is not --name=value.")
        name, eq, value = arg[2:].partition("=")
        if not eq:
            if not rest or rest[0].startswith("--"):
                raise UsageError(f"a tuning trial's argument --{name} has no value.")
            value = rest.pop(0)
        if "," in value:
            raise UsageError(f"a tuning trial's value --{name}={value!r} contains a comma.")
        items.append(f"{name}={value}")
    return ",".join(items)


def run(args):
    train = tensorflow_module("experiments.training.run")
    experiment, config = train_config(args)
    model_dir, export_dir, tensorboard_dir, flat = model_dirs(args)
    result = train.train(experiment, config, model_dir=model_dir, data_dir=data_dir(args),
                         source_dir=args.source_dir, strategy=args.strategy,
                         engine=args.engine, skip_corrupt=args.skip_corrupt, export_dir=export_dir,
                         tensorboard_dir=tensorboard_dir, preemption_grace=args.preemption_grace,
                         flat_export=flat, hypertune_metric=args.hypertune_metric,
                         evaluations=evaluations.Recorder(args.evaluations_file,
                                                          args.print_evaluations),
                         track=args.track, register=args.register,
                         restart_order=args.restart_order)
    if result.metrics:
        print(f"final metrics: {format_metrics(result.metrics)} "
              f"({describe_evaluation(result.evaluated)})")
    print_export(result.export_dir)
    local = result.task == "chief-0" and not os.environ.get("TF_CONFIG")
    print(f"{'' if local else f'[{result.task}] '}done in {duration(result.seconds)}")
    return 0
