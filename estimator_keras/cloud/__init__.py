"""Run an experiment as a Vertex AI CustomJob or a Kubeflow TFJob.

Import the module you need; this package file imports nothing.

* :mod:`~estimator_keras.cloud.spec` -- :class:`JobSpec` (what to run, on which
  machines) and its validation, :func:`parse_accelerator`, the GPU types,
  machine type and prebuilt training images. TF-free.
* :mod:`~estimator_keras.cloud.vertex` -- :func:`build_custom_job`, the Vertex
  AI ``CustomJob`` request body. TF-free.
* :mod:`~estimator_keras.cloud.tfjob` -- :func:`build_tfjob_manifest`, a
  Kubeflow ``TFJob``, and :func:`to_yaml`. TF-free.
* :mod:`~estimator_keras.cloud.packaging` -- building the sdist a Vertex job
  installs (:func:`build_sdist`, :func:`expected_sdist_name`).
* :mod:`~estimator_keras.cloud.backends` -- :class:`Submitter` (the ``gcloud``
  CLI or the ``google-cloud-aiplatform`` SDK) and the ``gcloud`` command lines.
* :mod:`~estimator_keras.cloud.submission` -- :func:`submit`: package, upload
  and create a job, or only show what would be done.
* :mod:`~estimator_keras.cloud.jobenv` -- the job side:
  :func:`resolve_vertex_environment` (directories from ``--model-dir`` or the
  ``AIP_*`` variables) and :func:`copy_to_remote`.

Nothing here prints; failures raise :class:`~estimator_keras.errors.CloudError`
(something could not be prepared or sent) or
:class:`~estimator_keras.errors.ConfigError` (a value given by the caller is wrong).

Sources for field names, images and formats (read 2026):

* CustomJob / CustomJobSpec REST body, ``baseOutputDirectory`` and the ``AIP_*``
  variables it makes Vertex set:
  https://cloud.google.com/vertex-ai/docs/reference/rest/v1/CustomJobSpec
* WorkerPoolSpec / PythonPackageSpec fields:
  https://cloud.google.com/vertex-ai/docs/training/configure-container-settings
* worker pool order (0 chief, 1 workers, 2 parameter servers, 3 evaluators; an
  unused pool is an empty value):
  https://cloud.google.com/vertex-ai/docs/training/distributed-training
* MachineSpec.acceleratorType values:
  https://cloud.google.com/vertex-ai/docs/reference/rest/v1/MachineSpec
* prebuilt TensorFlow 2.15 training images (tf-cpu.2-15.py310 / tf-gpu.2-15.py310):
  https://cloud.google.com/vertex-ai/docs/training/pre-built-containers
* ``gcloud ai custom-jobs create`` (``--display-name`` required, ``--config`` is a
  YAML ``CustomJobSpec`` with camelCase keys):
  https://cloud.google.com/sdk/gcloud/reference/ai/custom-jobs/create
* TFJob (``kubeflow.org/v1``, ``tfReplicaSpecs``, container named ``tensorflow``):
  https://www.kubeflow.org/docs/components/training/tftraining/
"""
