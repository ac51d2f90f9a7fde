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
import difflib


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


def did_you_mean(extra, *parsers):
    """`` (did you mean --max-steps?)`` for the unknown flags in ``extra``
    that are close to a flag of ``parsers`` (any ArgumentParser); "" if none."""
    # argparse has no public list of a parser's flags; its actions hold them.
    flags = sorted({s for parser in parsers
                    for action in parser._actions  # pylint: disable=protected-access
                    for s in action.option_strings if s.startswith("--")})
    hints = []
    for arg in extra:
        name = arg.split("=", 1)[0]
        if name.startswith("--") and name not in flags:
            close = closest(name, flags)
            if close and close not in hints:
                hints.append(close)
    return f" (did you mean {' or '.join(hints)}?)" if hints else ""


def closest(name, choices):
    """The one of ``choices`` that a mistyped ``name`` is close to, or None."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.75)
    return close[0] if close else None
