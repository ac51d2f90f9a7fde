"""The job side of a cloud run: where it writes, and copying results to ``gs://``.

:func:`resolve_vertex_environment` picks the directories a training run uses
from ``--model-dir`` or the ``AIP_*`` variables Vertex AI sets;
:func:`copy_to_remote` copies local files or trees to Cloud Storage. TF-free at
import: :mod:`estimator_keras.io` loads TensorFlow only for remote paths.

What Vertex AI sets when a job has ``baseOutputDirectory`` B (CustomJobSpec's
``baseOutputDirectory`` field,
https://cloud.google.com/vertex-ai/docs/reference/rest/v1/CustomJobSpec, read 2026):

* a CustomJob: ``AIP_MODEL_DIR`` = B/model/, ``AIP_CHECKPOINT_DIR`` =
  B/checkpoints/, ``AIP_TENSORBOARD_LOG_DIR`` = B/logs/;
* the CustomJob of a HyperparameterTuningJob trial: the same under
  B/<trial_id>/ (each trial's base output directory is a subfolder named after
  the trial id).

Vertex Model Registry imports a model from the folder it is given (the artifact
URI), and its prebuilt TensorFlow serving containers expect a SavedModel there,
``saved_model.pb`` by that exact name: https://cloud.google.com/vertex-ai/docs/general/import-model
and https://cloud.google.com/vertex-ai/docs/training/exporting-model-artifacts.
So the final export goes to AIP_MODEL_DIR flat.
TensorBoard event files belong in AIP_TENSORBOARD_LOG_DIR, which Vertex AI
TensorBoard reads: https://cloud.google.com/vertex-ai/docs/experiments/tensorboard-training.
"""

import logging
import os
import time
from typing import Dict, List, Mapping, Optional

from estimator_keras import io
from estimator_keras.errors import CloudError, ConfigError

logger = logging.getLogger(__name__)


def resolve_vertex_environment(model_dir: Optional[str] = None,
                               env: Optional[Mapping[str, str]] = None) -> Dict[str, object]:
    """Directories a training run should use, from ``--model-dir`` or Vertex's AIP_* vars.

    Mapping (keys of the result):

    * ``model_dir`` -- where training checkpoints: ``model_dir`` when given (it
      wins over everything), else ``AIP_CHECKPOINT_DIR``, else the parent of
      ``AIP_MODEL_DIR`` (the base output directory).
    * ``checkpoint_dir`` -- same as ``model_dir``.
    * ``tensorboard_dir`` -- where event files go: with an explicit
      ``model_dir``, that folder; else ``AIP_TENSORBOARD_LOG_DIR`` when set,
      else ``model_dir``.
    * ``export_dir`` -- where the final export goes: with an explicit
      ``model_dir``, ``<model_dir>/export``; else ``AIP_MODEL_DIR`` when set,
      else ``<model_dir>/export``.
    * ``flat_export`` -- True on Vertex: the export is laid out as Vertex Model
      Registry imports it, ``saved_model.pb`` (and ``variables/``) at the root
      of ``export_dir`` with ``model.h5``, ``weights.h5`` and ``export.json``
      beside it; False with ``--model-dir`` (``export_dir/saved_model/``).
    * ``source`` -- ``"flag"`` or ``"vertex"``.

    Trailing slashes are removed. Raises ConfigError when neither ``model_dir``
    nor any AIP_* directory is available.

    >>> dirs = resolve_vertex_environment(env={"AIP_MODEL_DIR": "gs://b/j/model/",
    ...     "AIP_CHECKPOINT_DIR": "gs://b/j/checkpoints/",
    ...     "AIP_TENSORBOARD_LOG_DIR": "gs://b/j/logs/"})
    >>> dirs["model_dir"], dirs["export_dir"], dirs["flat_export"]
    ('gs://b/j/checkpoints', 'gs://b/j/model', True)
    """
    env = os.environ if env is None else env
    if model_dir:
        base = model_dir.rstrip("/") or model_dir
        return {"model_dir": base, "checkpoint_dir": base, "tensorboard_dir": base,
                "export_dir": io.join(base, "export"), "flat_export": False,
                "source": "flag"}
    aip_model = (env.get("AIP_MODEL_DIR") or "").strip()
    aip_ckpt = (env.get("AIP_CHECKPOINT_DIR") or "").strip()
    aip_logs = (env.get("AIP_TENSORBOARD_LOG_DIR") or "").strip()
    if aip_ckpt:
        base = aip_ckpt.rstrip("/")
    elif aip_model:
        base = io.parent(aip_model)
    else:
        raise ConfigError(
            "No model directory: pass --model-dir DIR, or run under Vertex AI with a "
            "base output directory so that AIP_MODEL_DIR / AIP_CHECKPOINT_DIR are set.")
    return {
        "model_dir": base,
        "checkpoint_dir": base,
        "tensorboard_dir": aip_logs.rstrip("/") if aip_logs else base,
        "export_dir": aip_model.rstrip("/") if aip_model else io.join(base, "export"),
        "flat_export": bool(aip_model),
        "source": "vertex",
    }


def copy_to_remote(local_path: str, remote_path: str) -> List[str]:
    """Copy a file, or a directory tree, to ``remote_path`` (local or ``gs://``).

    Keras' HDF5 writer (h5py) only writes local files, so a model is saved
    locally first and copied with this to ``gs://``. ``remote_path`` is the
    destination itself (a file for a file, a folder for a folder); existing
    files are replaced. Each file is written under a temporary name and renamed,
    so a reader never sees half a file (on GCS a rename is a copy and delete, so
    that holds per object, not per tree). Returns the destination files written.

    Example::

        model.save("/tmp/m.h5")
        copy_to_remote("/tmp/m.h5", os.environ["AIP_MODEL_DIR"] + "model.h5")
    """
    if not io.exists(local_path):
        raise CloudError("Cannot copy %s to %s: the local path does not exist."
                         % (local_path, remote_path))
    is_tree = io.isdir(local_path)
    if is_tree and not io.is_remote(remote_path):
        src, dst = os.path.abspath(local_path), os.path.abspath(remote_path)
        if dst == src or dst.startswith(src.rstrip(os.sep) + os.sep):
            raise CloudError("Cannot copy %s into %s: the destination is inside the "
                             "source." % (local_path, remote_path))
    started = time.time()
    try:
        if not is_tree:
            io.makedirs(io.parent(remote_path))
            io.copy_file(local_path, remote_path)
            return [remote_path]
        written = io.copy_tree(local_path, remote_path)
    # OSError for local files, tf.errors.OpError (not an OSError) for gs:// ones.
    except Exception as exc:  # pylint: disable=broad-except
        raise CloudError("Copying %s to %s failed: %s"
                         % (local_path, remote_path, getattr(exc, "message", exc))) from exc
    logger.info("copied %d files from %s to %s in %.1f s", len(written), local_path,
                remote_path, time.time() - started)
    return written
