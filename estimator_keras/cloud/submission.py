"""Start a :class:`~estimator_keras.cloud.spec.JobSpec` on Vertex AI: a CustomJob,
or with a :class:`~estimator_keras.tuning.space.Study` a HyperparameterTuningJob.

:func:`submit` packages the project and the user's own packages, uploads the
sdists (and a local config file) beside the job, builds the request and
creates the job, or, as a dry run, only returns what it would send and run. A
job from an image with the package installed (``spec.container_image``) needs
no sdist.
"""

import dataclasses
import os
import tempfile
from typing import Any, Dict, List, Optional

from estimator_keras import io
from estimator_keras.cloud import backends, packaging, vertex, vertex_check
from estimator_keras.cloud.spec import JobSpec
from estimator_keras.errors import CloudError, ConfigError
from estimator_keras.tuning.space import Study


def _request(spec: JobSpec, study: Optional[Study]) -> Dict[str, Any]:
    """The request body, checked with google-cloud-aiplatform's own types
    where that SDK is installed (:func:`~estimator_keras.cloud.vertex_check.check_request`)."""
    request = vertex.build_tuning_job(spec, study) if study else vertex.build_custom_job(spec)
    vertex_check.check_request(request, "tuning" if study else "custom")
    return request


def _package_uri(spec: JobSpec, file_name: str, taken: Dict[str, str], source: str) -> str:
    """``<job_dir>/packages/<file_name>``; CloudError when two packages would
    upload to one name."""
    if file_name in taken:
        raise CloudError(
            "Two packages would upload as %s: %s and %s. Give them different names or "
            "versions in their setup.py or pyproject.toml." % (file_name, taken[file_name],
                                                               source))
    taken[file_name] = source
    return "%s/packages/%s" % (spec.job_dir, file_name)


def _check_config(spec: JobSpec) -> Optional[str]:
    """The local config file to upload, or None (none, or already gs://)."""
    if not spec.config or spec.config.startswith("gs://"):
        return None
    if not io.isfile(spec.config):
        raise ConfigError("--config %s: no such file (the job reads it from %s once "
                          "submit has uploaded it)." % (spec.config, spec.config_uri))
    return spec.config


def submit(spec: JobSpec, dry_run: bool = False,
           submitter: Optional[backends.Submitter] = None,
           project_root: Optional[str] = None,
           study: Optional[Study] = None) -> Dict[str, Any]:
    """Package, upload and start ``spec`` as a Vertex AI CustomJob, or as a
    HyperparameterTuningJob running ``study`` when one is given.

    In order: build the sdist (:func:`~estimator_keras.cloud.packaging.build_sdist`,
    with the requirements the engine's prebuilt image lacks) and upload it to
    ``<job_dir>/packages/<file>``; likewise each of ``spec.package_dirs``
    (:func:`~estimator_keras.cloud.packaging.build_package_sdist`), whose URIs
    join ``extra_package_uris``; upload a local ``spec.config`` to
    ``spec.config_uri``; build the request
    (:func:`~estimator_keras.cloud.vertex.build_custom_job` or
    :func:`~estimator_keras.cloud.vertex.build_tuning_job`) and, where
    google-cloud-aiplatform is installed, parse it with its v1 types
    (a ConfigError names a field that does not parse); create the job. With
    ``spec.package_uri`` or ``spec.container_image`` set, this package's sdist
    is neither built nor uploaded.

    With ``dry_run`` nothing is built, uploaded or created: the result holds the
    request and, as argument lists, the commands a real run would amount to
    (``gcloud`` form; the real run uses a temporary dist folder and config file),
    with ``"workdirs"``: the folder each command runs in (None: here; this
    package's sdist builds in the project root).

    Returns ``{"dry_run", "request", "package_uri", "package_requires"}`` plus
    ``"commands"``, ``"workdirs"`` and ``"config"`` (the gcloud --config
    content) for a dry run, or ``"job"`` otherwise.
    """
    spec.validate(for_vertex=True)
    if study is not None:
        study.validate()
    needs_package = not spec.package_uri and not spec.container_image
    requires = spec.package_requires if needs_package else []
    project_root = project_root or packaging.default_project_root()
    config_file = _check_config(spec)
    taken: Dict[str, str] = {}
    if dry_run:
        commands: List[List[str]] = []
        workdirs: List[Optional[str]] = []
        planned = dataclasses.replace(spec, package_dirs=[],
                                      extra_package_uris=list(spec.extra_package_uris))
        if needs_package:
            file_name = packaging.expected_sdist_name(project_root)
            planned.package_uri = _package_uri(spec, file_name, taken, "this package")
            commands.append(packaging.sdist_command("dist"))
            # os.path.join: the command runs on this machine, in the project root.
            commands.append(backends.gcloud_upload_command(os.path.join("dist", file_name),
                                                           planned.package_uri))
            workdirs += [None, None]
        for directory in spec.package_dirs:
            file_name = packaging.expected_sdist_name(
                directory, fallback=os.path.basename(os.path.abspath(directory)) + ".tar.gz")
            uri = _package_uri(spec, file_name, taken, "--package-dir %s" % directory)
            planned.extra_package_uris.append(uri)
            commands.append(packaging.package_sdist_command(directory, "dist"))
            commands.append(backends.gcloud_upload_command(
                os.path.join(directory, "dist", file_name), uri))
            workdirs += [directory, None]
        if config_file:
            commands.append(backends.gcloud_upload_command(config_file, spec.config_uri))
            workdirs.append(None)
        request = _request(planned, study)
        if study:
            create_argv, config = backends.gcloud_tuning_command(
                request, spec.project, spec.region, "hptuning_job.json")
        else:
            create_argv, config = backends.gcloud_create_command(
                request, spec.project, spec.region, "job_spec.json")
        commands.append(create_argv)
        workdirs.append(None)
        return {"dry_run": True, "request": request, "package_uri": planned.package_uri,
                "package_requires": requires, "commands": commands, "workdirs": workdirs,
                "config": config}

    submitter = submitter or backends.Submitter()
    package_dirs = list(spec.package_dirs)
    spec = dataclasses.replace(spec, package_dirs=[],
                               extra_package_uris=list(spec.extra_package_uris))
    if needs_package or package_dirs:
        dist_dir = io.new_dir(tempfile.gettempdir(), "estimator-keras-sdist-")
        try:
            # Every archive is built, and its name checked, before any upload.
            archives = []
            if needs_package:
                archive = packaging.build_sdist(project_root, dist_dir, requires=requires)
                archives.append((archive, _package_uri(spec, io.basename(archive), taken,
                                                       "this package")))
            for index, directory in enumerate(package_dirs):
                archive = packaging.build_package_sdist(
                    directory, io.join(dist_dir, "package-%d" % index))
                archives.append((archive, _package_uri(spec, io.basename(archive), taken,
                                                       "--package-dir %s" % directory)))
            uris = [submitter.upload(archive, uri) for archive, uri in archives]
        finally:
            io.rmtree(dist_dir)
        if needs_package:
            spec.package_uri = uris.pop(0)
        spec.extra_package_uris.extend(uris)
    if config_file:
        submitter.upload(config_file, spec.config_uri)
    request = _request(spec, study)
    if study:
        job = submitter.create_tuning_job(request, spec.project, spec.region)
    else:
        job = submitter.create_job(request, spec.project, spec.region)
    return {"dry_run": False, "request": request, "package_uri": spec.package_uri,
            "package_requires": requires, "job": job}
