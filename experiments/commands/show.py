"""``list``, ``show`` and ``inspect``: the commands that print what is there
(the catalog, an experiment's resolved configuration, an engine's registry
entry, a dataset's records) and change nothing."""

import importlib

import yaml

from estimator_keras import engines
from estimator_keras.errors import UsageError
from experiments.catalog import loading as catalog
from experiments.catalog import registry
from experiments.commands.common import experiment_config
from experiments.config import files as config_files


def cmd_list(args):
    broken = catalog.load(getattr(args, "modules", None))
    print("experiments:")
    for name in registry.names():
        c = registry.get(name).config
        decay = c.train.learning_rate_decay
        lr = f"{c.train.learning_rate}" + ("" if decay == "constant" else f" ({decay} decay)")
        print(f"  {name:<20} {c.description}")
        print(f"  {'':<20} dataset {c.data.dataset or '(--dataset)'}, batch "
              f"{c.train.batch_size}, {c.train.max_steps} steps, lr {lr}; "
              f"from {registry.origin_of('experiment', name)}")
    print("datasets:")
    for name in registry.dataset_names():
        print(f"  {name:<20} {registry.dataset(name).description}; from "
              f"{registry.origin_of('dataset', name)}")
    if broken:
        print("broken plugins (their experiments are missing above):")
        for item in broken:
            print(f"  {item.message()}")
    print(f"engines (--engine auto: {engines.AUTO_RULE}):")
    for name, status in engines.describe():
        print(f"  {name:<20} {status}")
    return 0


def cmd_show(args):
    if getattr(args, "engine", None):
        if args.name:
            raise UsageError(f"show takes an experiment NAME or --engine, not both (got "
                             f"{args.name} and --engine {args.engine}).")
        entry = engines.registry.get(args.engine)
        status = dict((name, text) for name, text in engines.describe())[entry.name]
        print(yaml.safe_dump(dict(entry.facts(), here=status), sort_keys=False,
                             default_flow_style=False, width=100), end="")
        return 0
    if not args.name:
        raise UsageError("show needs an experiment NAME (see `list`), or --engine ENGINE.")
    _, config = experiment_config(args)
    print(config_files.to_yaml(config), end="")
    return 0


def cmd_inspect(args):
    # Loaded when inspect runs: the other commands start without the records
    # layer (which needs no TensorFlow).
    verify = importlib.import_module("estimator_keras.verify")
    report = verify.inspect(args.path, verify=args.verify)
    print(verify.format_report(report))
    return 1 if report.broken else 0
