"""The command lines' argparse parser: no abbreviations, one-paragraph
errors, and the flag a mistyped one was probably meant to be.

argparse takes any unambiguous prefix of a flag for the flag, so a typo such
as ``--max-step 10`` would silently run as ``--max-steps 10``. The parsers
of ``python -m experiments`` (every command) and ``python -m benchmarks``
are :class:`Parser`, which refuses it and names the close match (the
benchmarks' child scripts pass ``allow_abbrev=False`` themselves)::

    python -m experiments train: error: unrecognized arguments: --max-step 10
    (did you mean --max-steps?)
"""

import argparse
import shlex

# The close match of a mistyped name, for every "did you mean" of the package.
from estimator_keras.errors import closest  # pylint: disable=unused-import


class Parser(argparse.ArgumentParser):
    """argparse without abbreviations (``allow_abbrev=False`` unless given),
    exiting 2 on bad usage with one paragraph that points to ``--help``."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # Command name -> its parser, once add_subparsers is called.
        self.commands = {}

    def add_subparsers(self, **kwargs):
        action = super().add_subparsers(**kwargs)
        self.commands = action.choices
        return action

    def parse_args(self, args=None, namespace=None):
        args, extra = self.parse_known_args(args, namespace)
        if extra:
            self.unrecognized(extra)
        return args

    def unrecognized(self, extra):
        """Exits 2 naming the arguments this parser does not take, and the
        flag each unknown one is close to."""
        self.error(f"unrecognized arguments: {' '.join(extra)}{did_you_mean(extra, self)}")

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\nSee `{self.prog} --help`.\n")


def _flags(parser):
    """{flag: whether it takes a value} of an ArgumentParser."""
    # argparse has no public list of a parser's flags; its actions hold them.
    return {s: action.nargs != 0
            for action in parser._actions  # pylint: disable=protected-access
            for s in action.option_strings}


def check_command_flags_come_after(parser, argv):
    """Exits 2 saying where they go when flags of a command come before it
    (``--max-steps 10 train NAME``): argparse would call ``10`` an invalid
    command. ``parser`` has the commands; its own flags may come first."""
    own, moved, rest, k = _flags(parser), [], [], 0
    while k < len(argv) and argv[k] not in parser.commands and argv[k] != "--":
        arg, name = argv[k], argv[k].split("=", 1)[0]
        taken = [c for c, p in parser.commands.items() if name in _flags(p)]
        if name in own or not taken:
            rest.append(arg)
            if own.get(name) and "=" not in arg and k + 1 < len(argv):
                rest.append(argv[k + 1])
                k += 1
        else:
            value = _flags(parser.commands[taken[0]])[name] and "=" not in arg
            moved += argv[k:k + 1 + value]
            k += value
        k += 1
    if moved:
        command = argv[k] if k < len(argv) and argv[k] in parser.commands else "COMMAND"
        fixed = " ".join([parser.prog, shlex.join([*rest, *argv[k:], *moved])]) \
            if command != "COMMAND" else f"{parser.prog} COMMAND ... {shlex.join(moved)}"
        own_flags = " and ".join(sorted(f for f in own if f.startswith("--") and f != "--help"))
        parser.error(f"{' '.join(moved)}: a command's flags go after the command, as in "
                     f"`{fixed}`; only {own_flags} may come before it.")


def did_you_mean(extra, *parsers):
    """`` (did you mean --max-steps?)`` for the unknown flags in ``extra``
    that are close to a flag of ``parsers`` (any ArgumentParser); "" if none."""
    flags = sorted({s for parser in parsers for s in _flags(parser) if s.startswith("--")})
    hints = []
    for arg in extra:
        name = arg.split("=", 1)[0]
        if name.startswith("--") and name not in flags:
            close = closest(name, flags)
            if close and close not in hints:
                hints.append(close)
    return f" (did you mean {' or '.join(hints)}?)" if hints else ""
