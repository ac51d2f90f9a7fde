"""One module a command: what each does once :mod:`experiments.cli` has parsed
its flags. Each command's function takes the parsed arguments and returns the
exit status; it prints results on stdout, progress on stderr."""

import importlib
import warnings

# The names of the module this package replaced (``experiments.commands``, all
# commands in one file): old name -> (module, its name there).
_MOVED = {
    **{name: ("common", name) for name in (
        "AIP_VARIABLES", "TRAIN_CONFIG_FLAGS", "check_flags_agree", "check_usage", "data_dir",
        "experiment_config", "load_catalog", "model_dirs", "tensorflow_module", "train_config")},
    "cmd_list": ("show", "cmd_list"), "cmd_show": ("show", "cmd_show"),
    "cmd_inspect": ("show", "cmd_inspect"), "trial_hparams": ("train", "trial_hparams"),
    "cmd_train": ("train", "run"), "describe_evaluation": ("evaluate", "describe_evaluation"),
    "cmd_evaluate": ("evaluate", "run"), "EXPORT_FILES": ("export", "EXPORT_FILES"),
    "print_export": ("export", "print_export"), "cmd_export": ("export", "run"),
}


def __getattr__(name):
    if name not in _MOVED:
        raise AttributeError(f"module 'experiments.commands' has no attribute {name!r}")
    module, new = _MOVED[name]
    warnings.warn(f"experiments.commands.{name} moved to experiments.commands.{module}.{new}",
                  DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(f"experiments.commands.{module}"), new)
