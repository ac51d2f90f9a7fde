"""Entry point: ``python -m experiments COMMAND ...`` (see experiments/cli.py)."""

import sys

from experiments.cli import main

if __name__ == "__main__":
    sys.exit(main())
