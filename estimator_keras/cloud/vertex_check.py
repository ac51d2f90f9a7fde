"""Vertex AI request bodies checked with google-cloud-aiplatform's own v1 types.

:func:`check_request` parses a body that :mod:`~estimator_keras.cloud.vertex`
built into ``aiplatform_v1.CustomJob`` or ``aiplatform_v1.HyperparameterTuningJob``
with protobuf's ``json_format.ParseDict``, which refuses a field those types do
not have, a value of the wrong type, a bad enum value or a malformed duration,
and names where. :func:`sdk_types` is the ``aiplatform_v1`` module, or None
where the ``cloud`` extra (``google-cloud-aiplatform``) is not installed: then
nothing is checked. TF-free; the SDK is imported on first use only.
"""

import warnings
from typing import Any, Mapping, Optional

from estimator_keras.errors import ConfigError

KINDS = {"custom": "CustomJob", "tuning": "HyperparameterTuningJob"}
"""Request kind -> the ``aiplatform_v1`` message its body is."""


def sdk_types() -> Optional[Any]:
    """``google.cloud.aiplatform_v1``, or None when it is not installed."""
    try:
        with warnings.catch_warnings():
            # google.api_core warns on import about Python versions it will drop.
            warnings.simplefilter("ignore", FutureWarning)
            from google.cloud import aiplatform_v1  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    return aiplatform_v1


def check_request(request: Mapping[str, Any], kind: str = "custom",
                  types: Optional[Any] = None) -> bool:
    """Parse ``request`` (a REST body, camelCase JSON names) as the
    ``aiplatform_v1`` message of ``kind`` ("custom" or "tuning").

    Returns True once parsed, False when google-cloud-aiplatform is not
    installed (nothing checked). Raises ConfigError naming the field and the
    path to it when the body does not parse.

    Example::

        check_request(build_custom_job(spec))            # True, or ConfigError
        check_request(build_tuning_job(spec, study), "tuning")
    """
    if kind not in KINDS:
        raise ConfigError("check_request kind must be one of %s; got %r."
                          % (", ".join(KINDS), kind))
    types = types if types is not None else sdk_types()
    if types is None:
        return False
    from google.protobuf import json_format  # pylint: disable=import-outside-toplevel
    message = getattr(types, KINDS[kind]).pb()()  # the protobuf class, then a message
    try:
        json_format.ParseDict(dict(request), message)
    except json_format.ParseError as exc:
        # The first line names the field and where; protobuf then lists every
        # field the message has.
        said = str(exc).split("\n", 1)[0].strip().rstrip(".")
        raise ConfigError(
            "The Vertex AI %s request this package built does not parse as "
            "google-cloud-aiplatform's aiplatform_v1.%s: %s. Vertex AI would refuse it, "
            "so no job was created. Please report this with the submit command line."
            % (KINDS[kind], KINDS[kind], said)) from None
    return True
