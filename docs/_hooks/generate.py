"""MkDocs hooks: the reference pages that are generated when the site is built.

A page asks for generated Markdown with a comment line of its own:

    <!-- generated: cli -->             every command and flag of `python -m experiments`,
                                        from the argparse parser the CLI itself builds
    <!-- generated: config -->          the config file's fields, from the dataclasses of
                                        experiments/config/types.py (types, defaults, docstrings)
    <!-- generated: engines -->         the engines, from the engine registry
    <!-- generated: experiments -->     the built-in experiments and datasets, from the registry
    <!-- generated: targets -->         submit's targets x engines, from estimator_keras.cloud.targets
    <!-- generated: python-api -->      a mkdocstrings entry for every public name of
                                        estimator_keras and experiments

So the reference cannot drift from the code: a flag added to the parser or a
field added to a dataclass is in the next build. BENCHMARKS.md and its plots
(benchmarks/published/) become the page benchmarks.md and its images, read
from where they are in the repository (nothing is copied into docs/).

Nothing here imports TensorFlow: the CLI's parser, the configs and the
registry of built-in experiments are TensorFlow-free by design
(tests/test_layout.py checks it).
"""

import argparse
import ast
import dataclasses
import glob
import os
import re
import sys

from mkdocs.structure.files import File

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARKER = re.compile(r"^<!-- generated: ([\w-]+) -->$", re.M)


def on_config(config):
    # The checkout's code, also when the package is not installed.
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    return config


def on_files(files, config):
    with open(os.path.join(ROOT, "BENCHMARKS.md"), encoding="utf-8") as f:
        files.append(File.generated(config, "benchmarks.md", content=f.read()))
    # BENCHMARKS.md links its plots and results as benchmarks/published/...,
    # which resolve from the page benchmarks.md as they do in the repository.
    for path in sorted(glob.glob(os.path.join(ROOT, "benchmarks", "published", "*"))):
        name = os.path.basename(path)
        if name.endswith((".png", ".json", ".txt")):
            files.append(File.generated(config, f"benchmarks/published/{name}",
                                        abs_src_path=path))
    return files


def on_page_markdown(markdown, page, config, files):
    def expand(match):
        kind = match.group(1)
        if kind not in GENERATORS:
            raise ValueError(f"{page.file.src_uri}: unknown generated section {kind!r}; "
                             f"known: {', '.join(sorted(GENERATORS))}")
        return GENERATORS[kind]()
    return MARKER.sub(expand, markdown)


# ---------------------------------------------------------------------------
# Text helpers


def _cell(text):
    """Plain text as a Markdown table cell: no HTML, emphasis or column breaks."""
    text = " ".join(str(text).split())
    for char, escaped in (("\\", "\\\\"), ("|", "\\|"), ("*", "\\*"), ("<", "&lt;"),
                          (">", "&gt;")):
        text = text.replace(char, escaped)
    return text


def _code(text):
    text = str(text).replace("|", "\\|")
    return f"``{text}``" if "`" in text else f"`{text}`"


# ---------------------------------------------------------------------------
# The CLI, from experiments.cli.build_parser()


def _subcommands(parser):
    # argparse has no public accessor for its actions: documentation tools
    # (sphinx-argparse, mkdocs-click's argparse cousins) read them the same way.
    for action in parser._actions:  # pylint: disable=protected-access
        if isinstance(action, argparse._SubParsersAction):  # pylint: disable=protected-access
            helps = {choice.dest: choice.help for choice in action._choices_actions}  # pylint: disable=protected-access
            return [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return []


def _help_text(action, prog):
    if not action.help:
        return ""
    values = dict(vars(action), prog=prog)
    if isinstance(values.get("choices"), (list, tuple)):
        values["choices"] = ", ".join(map(str, values["choices"]))
    return action.help % values if "%(" in action.help else action.help


def _argument(action):
    if not action.option_strings:
        return _code(action.metavar or action.dest)
    value = ""
    if action.nargs != 0:
        if action.choices:
            value = " {" + ",".join(map(str, action.choices)) + "}"
        else:
            value = " " + (action.metavar or action.dest.upper())
    return ", ".join(_code(option + value) for option in action.option_strings)


def _default(action):
    if action.required:
        return "required"
    if action.nargs == 0 or action.default in (None, "", [], argparse.SUPPRESS):
        return ""
    return _code(action.default)


def _groups_table(parser, prog, skip=()):
    out = []
    for group in parser._action_groups:  # pylint: disable=protected-access
        actions = [a for a in group._group_actions  # pylint: disable=protected-access
                   if a.help != argparse.SUPPRESS and a.dest not in skip
                   and not isinstance(a, (argparse._HelpAction,  # pylint: disable=protected-access
                                          argparse._SubParsersAction))]  # pylint: disable=protected-access
        if not actions:
            continue
        out.append(f"**{_cell(group.title)}**" + (f": {_cell(group.description)}"
                                                   if group.description else ""))
        out.append("")
        out.append("| argument | default | meaning |")
        out.append("| --- | --- | --- |")
        for action in actions:
            out.append(f"| {_argument(action)} | {_default(action)} | "
                       f"{_cell(_help_text(action, prog))} |")
        out.append("")
    return out


def generate_cli():
    from experiments.cli import build_parser  # pylint: disable=import-outside-toplevel

    parser = build_parser()
    out = ["Generated from the parser of `python -m experiments` when this site was built: "
           "`python -m experiments COMMAND --help` prints the same.", ""]
    out.append(f"```text\n{parser.format_usage().strip()}\n```")
    out.append("")
    out += _groups_table(parser, parser.prog)
    out.append("| command | what it does |")
    out.append("| --- | --- |")
    commands = _subcommands(parser)
    for name, helptext, _ in commands:
        out.append(f"| [`{name}`](#{name}) | {_cell(helptext)} |")
    out.append("")
    global_flags = {"verbose", "modules", "modules_after"}
    for name, helptext, sub in commands:
        out.append(f"## `{name}` {{#{name}}}")
        out.append("")
        out.append(_cell(helptext) + ".")
        out.append("")
        out.append(f"```text\n{sub.format_usage().strip()}\n```")
        out.append("")
        if sub.description:
            out.append(_cell(sub.description))
            out.append("")
        out += _groups_table(sub, sub.prog, skip=global_flags)
        if sub.epilog:
            out.append(f"```text\n{sub.epilog.strip()}\n```")
            out.append("")
        out.append("`--verbose` and `--module MOD` work here too (see above).")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# Config fields, from experiments/config/types.py


def _field_docs(path, class_name):
    """(class docstring, {field: docstring}, {field: annotation}) of a
    dataclass: the string literal after each field, the annotation as written."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            docs, types, body = {}, {}, node.body
            for stmt, following in zip(body, body[1:] + [None]):
                if isinstance(stmt, ast.AnnAssign):
                    types[stmt.target.id] = ast.unparse(stmt.annotation).replace("typing.", "")
                if (isinstance(stmt, ast.AnnAssign) and isinstance(following, ast.Expr)
                        and isinstance(following.value, ast.Constant)
                        and isinstance(following.value.value, str)):
                    docs[stmt.target.id] = following.value.value
            return ast.get_docstring(node), docs, types
    raise ValueError(f"{path} has no class {class_name}")


def _field_default(field):
    if field.default is not dataclasses.MISSING:
        return _code(repr(field.default) if isinstance(field.default, str) else field.default)
    if field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        return _code(value) if not dataclasses.is_dataclass(value) else "its own defaults"
    return "required"


def generate_config():
    from experiments.config import types as config  # pylint: disable=import-outside-toplevel

    path = os.path.join(ROOT, "experiments", "config", "types.py")
    out = ["Generated from the dataclasses of `experiments/config/types.py` (their fields and "
           "docstrings) when this site was built. A config file's sections `data` and "
           "`train` take the fields of `DataConfig` and `TrainConfig`; `--hparams` takes "
           "the same names, without the section.", ""]
    for cls, section in ((config.DataConfig, "data"), (config.TrainConfig, "train"),
                         (config.ExperimentConfig, None)):
        doc, docs, types = _field_docs(path, cls.__name__)
        title = f"`{section}`: `{cls.__name__}`" if section else f"`{cls.__name__}`"
        out.append(f"## {title}")
        out.append("")
        out.append(_cell(doc))
        if section is None:
            out.append("The whole configuration, as `show` prints it and "
                       "`MODEL_DIR/config.yaml` records it; a config file sets only "
                       "its `data`, `train` and `model` sections.")
        out.append("")
        out.append("| field | type | default | meaning |")
        out.append("| --- | --- | --- | --- |")
        for field in dataclasses.fields(cls):
            out.append(f"| `{field.name}` | {_cell(types.get(field.name, ''))} | "
                       f"{_field_default(field)} | {_cell(docs.get(field.name, ''))} |")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# The built-in experiments and datasets, from the registry


def generate_experiments():
    from experiments.catalog import loading as catalog  # pylint: disable=import-outside-toplevel
    from experiments.catalog import registry  # pylint: disable=import-outside-toplevel

    catalog.load((), entry_points=False)
    out = ["Generated from the registry when this site was built (what `python -m "
           "experiments list` prints, in more detail).", "",
           "| experiment | description | dataset | training defaults | model hyperparameters "
           "(defaults) | best metric |",
           "| --- | --- | --- | --- | --- | --- |"]
    for name in registry.names():
        if not registry.origin_of("experiment", name).startswith("built-in"):
            continue
        c = registry.get(name).config
        train = (f"batch {c.train.batch_size}, {c.train.max_steps} steps, "
                 f"{c.train.optimizer} {c.train.learning_rate:g}"
                 + ("" if c.train.learning_rate_decay == "constant"
                    else f" ({c.train.learning_rate_decay} decay)")
                 + f", evaluate every {c.train.eval_every_steps}, precision {c.train.precision}")
        model = ", ".join(f"`{k}={v}`" for k, v in c.model.items())
        out.append(f"| `{name}` | {_cell(c.description)} | "
                   f"{_code(c.data.dataset) if c.data.dataset else '`--dataset`'} | "
                   f"{_cell(train)} | {model} | `{c.best_metric}` |")
    out += ["", "| dataset | description |", "| --- | --- |"]
    for name in registry.dataset_names():
        if registry.origin_of("dataset", name).startswith("built-in"):
            out.append(f"| `{name}` | {_cell(registry.dataset(name).description)} |")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# The engines, from the engine registry


def generate_engines():
    from estimator_keras.engines import registry  # pylint: disable=import-outside-toplevel

    facts = [entry.facts() for entry in registry.entries()]
    out = ["Generated from the engine registry when this site was built (what `python -m "
           "experiments show --engine NAME` prints for each engine).", "",
           "| | " + " | ".join(_code(f["engine"]) for f in facts) + " |",
           "| --- |" + " --- |" * len(facts)]
    for field in list(facts[0])[1:]:
        out.append(f"| {_cell(field)} | " + " | ".join(_cell(f[field]) for f in facts) + " |")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# The Python API: one mkdocstrings entry per public name


def generate_python_api():
    import estimator_keras  # pylint: disable=import-outside-toplevel
    import experiments  # pylint: disable=import-outside-toplevel

    # estimator_keras resolves its names lazily (importing TensorFlow); its
    # table of exports says where each one is defined.
    exports = estimator_keras._EXPORTS  # pylint: disable=protected-access
    by_module = {}
    for name in estimator_keras.__all__:
        by_module.setdefault(exports[name], []).append(name)
    for name in experiments.__all__:
        by_module.setdefault(getattr(experiments, name).__module__, []).append(name)
    out = []
    for package in ("estimator_keras", "experiments"):
        out.append(f"## `{package}`")
        out.append("")
        for module in sorted(m for m in by_module if m.split(".")[0] == package):
            for name in sorted(by_module[module]):
                out.append(f"::: {module}.{name}")
                out.append("    options:")
                out.append(f"      heading: \"{package}.{name}\"")
                out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------
# The cloud targets, from estimator_keras.cloud.targets and the engine registry


def generate_targets():
    from estimator_keras.cloud import targets  # pylint: disable=import-outside-toplevel

    facts = [targets.facts(t) for t in targets.TARGETS]
    out = ["Generated from `estimator_keras/cloud/targets.py` and the engine registry when this "
           "site was built: the cluster tasks each engine runs on each target (\"no\": the "
           "target refuses the engine).", "",
           "| | " + " | ".join(f"`--target {t.name}`" for t in targets.TARGETS) + " |",
           "| --- |" + " --- |" * len(facts)]
    for field in facts[0]:
        out.append(f"| {_cell(field)} | " + " | ".join(_cell(f[field]) for f in facts) + " |")
    return "\n".join(out)


GENERATORS = {"cli": generate_cli, "config": generate_config, "engines": generate_engines,
              "experiments": generate_experiments, "python-api": generate_python_api,
              "targets": generate_targets}
