"""Named experiments and the ``python -m experiments`` runner."""
