"""Start a :class:`~estimator_keras.cloud.spec.JobSpec` as a Vertex AI CustomJob.

:func:`submit` packages the project, uploads the sdist beside the job, builds
the request and creates the job, or, as a dry run, only returns what it would
send and run.
"""

import dataclasses
import os
import tempfile
from typing import Any, Dict, List, Optional

from estimator_keras import io
from estimator_keras.cloud import backends, packaging, vertex
from estimator_keras.cloud.spec import JobSpec


def submit(spec: JobSpec, dry_run: bool = False,
           submitter: Optional[backends.Submitter] = None,
           project_root: Optional[str] = None) -> Dict[str, Any]:
    """Package, upload and start ``spec`` as a Vertex AI CustomJob.

    In order: build the sdist (:func:`~estimator_keras.cloud.packaging.build_sdist`),
    upload it to ``<job_dir>/packages/<file>``, build the request
    (:func:`~estimator_keras.cloud.vertex.build_custom_job`), create the job. With
    ``spec.package_uri`` set, the first two steps are skipped.

    With ``dry_run`` nothing is built, uploaded or created: the result holds the
    request and, as argument lists, the commands a real run would amount to
    (``gcloud`` form; the real run uses a temporary dist folder and config file).

    Returns ``{"dry_run", "request", "package_uri"}`` plus ``"commands"`` and
    ``"config"`` (the --config content) for a dry run, or ``"job"`` otherwise.
    """
    spec.validate(for_vertex=True)
    project_root = project_root or packaging.default_project_root()
    if dry_run:
        commands: List[List[str]] = []
        planned = dataclasses.replace(spec)
        if not planned.package_uri:
            file_name = packaging.expected_sdist_name(project_root)
            planned.package_uri = "%s/packages/%s" % (spec.job_dir, file_name)
            commands.append(packaging.sdist_command("dist"))
            # os.path.join: the command runs on this machine, in the project root.
            commands.append(backends.gcloud_upload_command(os.path.join("dist", file_name),
                                                           planned.package_uri))
        request = vertex.build_custom_job(planned)
        create_argv, config = backends.gcloud_create_command(
            request, spec.project, spec.region, "job_spec.json")
        commands.append(create_argv)
        return {"dry_run": True, "request": request, "package_uri": planned.package_uri,
                "commands": commands, "config": config}

    submitter = submitter or backends.Submitter()
    spec = dataclasses.replace(spec)
    if not spec.package_uri:
        dist_dir = io.new_dir(tempfile.gettempdir(), "estimator-keras-sdist-")
        try:
            archive = packaging.build_sdist(project_root, dist_dir)
            spec.package_uri = submitter.upload(
                archive, "%s/packages/%s" % (spec.job_dir, io.basename(archive)))
        finally:
            io.rmtree(dist_dir)
    request = vertex.build_custom_job(spec)
    job = submitter.create_job(request, spec.project, spec.region)
    return {"dry_run": False, "request": request, "package_uri": spec.package_uri,
            "job": job}
