"""Where a TensorFlow error comes from, and its one line for a person.

TensorFlow names the ops an error went through: ``error.op`` in graph mode
and, in every mode, the annotations at the end of its message,
``[[{{node NAME}}]]`` for the op that raised it, then ``[[NAME]]`` for each
op that ran that one. A dataset's functions run inside the iterator op that
the training step calls, so an error raised while reading or parsing
records always went through a dataset iterator's get-next op; an error in
the model, the optimizer, a collective all-reduce or a checkpoint did not.
Only the first kind is the data's fault.

Example::

    try:
        model.fit(dataset, ...)
    except tf.errors.OpError as e:
        if from_input_pipeline(e):
            ...  # the records
        else:
            raise TensorFlowError(describe(e, task="worker-0")) from e
"""

import re

# The ops through which a training or evaluation step takes its next batch.
ITERATOR_OPS = frozenset({
    "IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional",
    "OptionalGetValue", "MultiDeviceIteratorGetNextFromShard"})

_ANNOTATION = re.compile(r"\[\[(?:\{\{node )?([^\[\]{}]+?)(?:\}\})?\]\]")
_NOT_THE_MESSAGE = re.compile(
    r"^(Graph execution error:|Detected at node |Node: '|<stack traces unavailable>|\[\[|"
    r"From /job:\S+:$)")
# "Error in user-defined function passed to MapDataset:3 transformation with
# iterator: Iterator::Root::...::ParallelMapV2: MESSAGE"
_DATASET_FRAME = re.compile(
    r"^Error in user-defined function passed to .*? transformation with iterator: \S+: ")
_CLUTTER = re.compile(r"\{\{function_node [^}]*\}\}\s*|\s*\[\[.*$|\s*\[Op:[^\]]*\]")


def message_of(error):
    """TensorFlow's message of ``error``: an OpError, or the
    UnicodeDecodeError TensorFlow raises when its message quotes bytes of a
    record that are not UTF-8 (then the message is what failed to decode)."""
    if isinstance(error, UnicodeDecodeError):
        return bytes(error.object).decode("utf-8", "replace")
    return getattr(error, "message", None) or str(error)


def failed_ops(error):
    """Names of the ops ``error`` went through, the one that raised it first."""
    names = []
    op = getattr(error, "op", None)
    if op is not None:
        names.append(op.name)
    for name in _ANNOTATION.findall(message_of(error)):
        if name not in names:
            names.append(name)
    return names


def _op_type(name):
    # A node is named after its op type unless told otherwise, inside the
    # scopes it was built in and with a count when the name was taken.
    return re.sub(r"_\d+$", "", name.rsplit("/", 1)[-1])


def from_input_pipeline(error):
    """True when ``error`` was raised by the input pipeline: it went through
    a dataset iterator's get-next op."""
    op = getattr(error, "op", None)
    if op is not None and getattr(op, "type", None) in ITERATOR_OPS:
        return True
    return any(_op_type(name) in ITERATOR_OPS for name in failed_ops(error))


def first_line(error, limit=300):
    """The line of TensorFlow's message that says what went wrong, without
    the stack of where the op was built, the dataset's frame, the op
    annotations and the function-node clutter."""
    text = message_of(error)
    for line in text.splitlines():
        line = _DATASET_FRAME.sub("", line)
        if not line.strip() or line[:1].isspace() or _NOT_THE_MESSAGE.match(line):
            continue
        line = _CLUTTER.sub("", line)
        line = " ".join(line.split())
        if line:
            return line if len(line) <= limit else line[:limit - 3] + "..."
    return " ".join(text.split())[:limit]


def describe(error, task=None):
    """"TensorFlow failed on task T in op O (Type): LINE" for an error that is
    not the data's."""
    ops = failed_ops(error)
    where = f" on task {task}" if task else ""
    in_op = f" in op {ops[0]}" if ops else ""
    return (f"TensorFlow failed{where}{in_op} ({type(error).__name__}): {first_line(error)}")
