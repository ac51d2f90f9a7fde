"""Run an experiment as a Vertex AI CustomJob or HyperparameterTuningJob, or a Kubeflow TrainJob, TFJob or JAXJob.

Import the module you need; this package file imports nothing.

* :mod:`~estimator_keras.cloud.spec` -- :class:`JobSpec` (what to run, on which
  machines, from which image) and its validation, :func:`parse_accelerator`, the
  GPU types, machine type and the prebuilt training image per engine. TF-free.
* the search space and a :class:`Study` over it are :mod:`estimator_keras.tuning.space`
  (local ``tune`` reads them too); :mod:`~estimator_keras.cloud.space` is its
  deprecated old name.
* :mod:`~estimator_keras.cloud.vertex` -- :func:`build_custom_job` and
  :func:`build_tuning_job`, the Vertex AI request bodies (pythonPackageSpec or
  containerSpec pools). TF-free.
* :mod:`~estimator_keras.cloud.vertex_options` -- :class:`VertexOptions`, what
  a Vertex AI job asks beyond its pools (Spot VMs, Flex-start, restarts, timeout,
  service account, network, persistent resource, web access, TensorBoard,
  Reduction Server's pool), the combinations Vertex refuses, and the
  ``CustomJobSpec`` fields they write. TF-free.
* :mod:`~estimator_keras.cloud.vertex_check` -- :func:`check_request`: a request
  body parsed with google-cloud-aiplatform's own ``aiplatform_v1`` types, where
  that SDK is installed. TF-free.
* :mod:`~estimator_keras.cloud.tfjob` -- :func:`build_tfjob_manifest`, a
  Kubeflow ``TFJob``, the helpers Kubeflow jobs share, and :func:`to_yaml`. TF-free.
* :mod:`~estimator_keras.cloud.trainjob` -- :func:`build_trainjob_manifest`, a
  Kubeflow Trainer v2 ``TrainJob`` for every engine, and
  :func:`build_tensorflow_runtime`, the ClusterTrainingRuntime TF_CONFIG
  clusters run on; :func:`check` with Trainer's API models. TF-free.
* :mod:`~estimator_keras.cloud.targets` -- what each ``submit --target``
  supports, per engine (the docs' table). TF-free.
* :mod:`~estimator_keras.cloud.jaxjob` -- :func:`build_jaxjob_manifest`, a
  Kubeflow ``JAXJob`` of keras3 processes on JAX's distributed runtime. TF-free.
* :mod:`~estimator_keras.cloud.packaging` -- building the sdists a Vertex job
  installs, offline (:func:`build_sdist`, with the requirements its image lacks;
  :func:`build_package_sdist` for the user's own package;
  :func:`expected_sdist_name`).
* :mod:`~estimator_keras.cloud.backends` -- :class:`Submitter` (the ``gcloud``
  CLI or the ``google-cloud-aiplatform`` SDK) and the ``gcloud`` command lines.
* :mod:`~estimator_keras.cloud.submission` -- :func:`submit`: package (this
  project and the user's ``package_dirs``), upload the sdists and a local
  config file, and create a job, or only show what would be done.
* :mod:`~estimator_keras.cloud.jobenv` -- the job side:
  :func:`resolve_vertex_environment` (directories from ``--model-dir`` or the
  ``AIP_*`` variables, and whether the export is laid out flat for Vertex
  Model Registry) and :func:`copy_to_remote`.
* :mod:`~estimator_keras.cloud.hypertune` -- the job side of a tuning trial:
  :func:`report` of the final metric (``cloudml-hypertune`` or its file format).
* :mod:`~estimator_keras.cloud.trainjob_status` -- the job side of a Kubeflow
  Trainer v2 TrainJob: :func:`from_environment`, a reporter of the training's
  progress into the TrainJob's status (the Kubeflow SDK, from a thread). TF-free.

Nothing here prints; failures raise :class:`~estimator_keras.errors.CloudError`
(something could not be prepared or sent) or
:class:`~estimator_keras.errors.ConfigError` (a value given by the caller is wrong),
but for progress reports to a TrainJob: they never fail a training, and say
what went wrong through the log they are given.

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
* prebuilt TensorFlow training images and their end-of-support dates (see
  :mod:`~estimator_keras.cloud.spec`):
  https://cloud.google.com/vertex-ai/docs/supported-frameworks-list
* containerSpec (imageUri, command, args):
  https://cloud.google.com/vertex-ai/docs/training/configure-container-settings
* HyperparameterTuningJob, StudySpec and how trials get their values (see
  :mod:`~estimator_keras.tuning.space`):
  https://cloud.google.com/vertex-ai/docs/training/using-hyperparameter-tuning
* ``gcloud ai custom-jobs create`` (``--display-name`` required, ``--config`` is a
  YAML ``CustomJobSpec`` with camelCase keys):
  https://cloud.google.com/sdk/gcloud/reference/ai/custom-jobs/create
* ``Scheduling`` (SPOT, FLEX_START, ``maxWaitDuration``,
  ``restartJobOnWorkerRestart``, ``timeout``), ``serviceAccount``, ``network``,
  ``persistentResourceId``, ``enableWebAccess``, ``tensorboard`` (see
  :mod:`~estimator_keras.cloud.vertex_options`):
  https://cloud.google.com/vertex-ai/docs/reference/rest/v1/CustomJobSpec, and
  google-cloud-aiplatform 2.7.0's ``aiplatform_v1.CustomJobSpec``
* Flex-start's GPUs, timeout and pools:
  https://cloud.google.com/vertex-ai/docs/training/schedule-jobs-dws
* Reduction Server (pool 2, the
  ``vertex-ai-restricted/training/reductionserver:latest`` image, n1-highcpu-16,
  NCCL all-reduce of GPU workers):
  https://cloud.google.com/vertex-ai/docs/training/distributed-training
* Vertex AI TensorBoard with custom training (a service account; job,
  TensorBoard and bucket in one region):
  https://cloud.google.com/vertex-ai/docs/experiments/tensorboard-setup,
  https://cloud.google.com/vertex-ai/docs/experiments/tensorboard-training
* persistent resources:
  https://cloud.google.com/vertex-ai/docs/training/persistent-resource-train
* TFJob (``kubeflow.org/v1``, ``tfReplicaSpecs``, container named ``tensorflow``):
  https://www.kubeflow.org/docs/components/training/tftraining/
* JAXJob (training-operator v1.9: ``jaxReplicaSpecs`` with only ``Worker``,
  container ``jax``, port ``jaxjob-port`` 6666, the COORDINATOR_ADDRESS,
  COORDINATOR_PORT, NUM_PROCESSES and PROCESS_ID it sets): github.com/kubeflow/
  training-operator v1.9.0, pkg/webhooks/jax/ and pkg/controller.v1/jax/
"""
