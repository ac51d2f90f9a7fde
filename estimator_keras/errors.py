"""The package's exception types.

Every error the library raises on purpose derives from :class:`EstimatorKerasError`
and carries a message meant for a person: it names the file, flag or key at fault
and says what was expected. The command-line layer (``experiments``) maps them to
exit codes: :class:`UsageError` -> 2, :class:`Preempted` -> 75, everything else -> 1.
"""

import difflib


def closest(name, choices):
    """The one of ``choices`` that a mistyped ``name`` is close to, or None:
    the "did you mean" of a message that names an unknown flag, key or name."""
    close = difflib.get_close_matches(str(name), [str(c) for c in choices], n=1, cutoff=0.75)
    return close[0] if close else None


class EstimatorKerasError(Exception):
    """Base class of every error this package raises deliberately."""


class UsageError(EstimatorKerasError):
    """The caller asked for something malformed (a flag, an hparam, a name)."""


class ConfigError(UsageError):
    """A configuration value (hparam, flag, TF_CONFIG, spec) is invalid."""


class ClusterConfigError(ConfigError):
    """TF_CONFIG or a cluster description is invalid."""


class DataError(EstimatorKerasError):
    """Input data is missing, incomplete or unreadable."""


class SchemaError(DataError):
    """Records do not match the schema or the model's inputs."""


class CorruptRecordError(DataError):
    """A TFRecord file is corrupt or truncated.

    Attributes:
      path: the file at fault.
      offset: byte offset where reading broke, or None when unknown.
      record: index of the record at fault, or None when unknown.
      reason: what is wrong with it, without the file and the advice around
        it (the message when not given).
    """

    def __init__(self, message, path=None, offset=None, record=None, reason=None):
        super().__init__(message)
        self.path = path
        self.offset = offset
        self.record = record
        self.reason = reason or message


class ModelDirError(EstimatorKerasError):
    """A model directory is unusable: wrong architecture, locked, unwritable."""


class CheckpointMismatchError(ModelDirError):
    """A checkpoint that does not fit the model: ``mismatched`` lines ("key:
    model (..), checkpoint (..)"), and the weights ``missing`` from the
    checkpoint or ``unexpected`` in it, ten of each at most."""

    def __init__(self, checkpoint, mismatched=(), missing=(), unexpected=()):
        lines = [f"checkpoint {checkpoint} does not fit this model's architecture "
                 f"(a model dir of another model?); refusing to restore it."]
        for label, items, sep in (("shape mismatches", mismatched, "; "),
                                  ("missing from the checkpoint", missing, ", "),
                                  ("in the checkpoint but not in the model", unexpected, ", ")):
            if items:
                lines.append(f"{label}: " + sep.join(items[:10])
                             + (f" (and {len(items) - 10} more)" if len(items) > 10 else "")
                             + ".")
        lines.append("Use a fresh --model-dir for a different model.")
        super().__init__(" ".join(lines))


class EngineMismatchError(ModelDirError, UsageError):
    """The chosen engine cannot read the model dir's checkpoints (another
    engine wrote them): a wrong ``--engine``, so a usage error (exit 2)."""


class NumericalError(EstimatorKerasError):
    """Training produced a NaN or infinite loss."""


class TensorFlowError(EstimatorKerasError):
    """TensorFlow failed outside the input pipeline (the model, the optimizer,
    a collective all-reduce, a checkpoint): not the data's fault. The message
    names the op, the task in a cluster, and TensorFlow's own words."""


class CloudError(EstimatorKerasError):
    """A cloud submission could not be prepared or sent."""


class Preempted(EstimatorKerasError):
    """Training stopped on SIGTERM or SIGINT after saving a checkpoint at the
    current step; rerunning the same command resumes from it.

    Attributes:
      step: the step of the checkpoint saved, or None when none could be.
    """

    # EX_TEMPFAIL: a temporary failure, worth retrying; schedulers that
    # restart failed tasks restart this one.
    exit_code = 75

    def __init__(self, message, step=None):
        super().__init__(message)
        self.step = step
