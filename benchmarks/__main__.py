"""``python -m benchmarks``; the logic lives in :mod:`benchmarks.cli`."""

import sys

from benchmarks.cli import main

sys.exit(main())
