"""`submit`'s Vertex AI job flags: scheduling, identity, network, TensorBoard, reducers.

:func:`add_vertex_flags` adds the argument group; :func:`vertex_options`
turns the parsed flags into the
:class:`~estimator_keras.cloud.vertex_options.VertexOptions` a JobSpec holds
(checked with the rest of the job by ``JobSpec.validate``). TF-free.
"""

import argparse

from estimator_keras.cloud.vertex_options import (DEFAULT_REDUCTION_SERVER_MACHINE_TYPE,
                                                  VertexOptions)
from estimator_keras.errors import UsageError


def _reducers(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError("expected a whole number of reducers > 0, got %r"
                                         % text)
    return value


def add_vertex_flags(parser: argparse.ArgumentParser) -> None:
    """The "Vertex AI job" argument group of ``submit``."""
    group = parser.add_argument_group(
        "Vertex AI job (--target vertex): scheduling, identity, TensorBoard, Reduction Server")
    group.add_argument("--spot", action="store_true",
                       help="run on Spot VMs (scheduling.strategy SPOT): cheaper, and Vertex "
                            "may preempt them; add --restart-on-preemption to resume")
    group.add_argument("--flex-start", action="store_true",
                       help="wait for the GPUs with Dynamic Workload Scheduler "
                            "(scheduling.strategy FLEX_START): L4, A100, H100, H200 or B200 "
                            "GPUs, the same machines in every pool, --timeout 7d at most; not "
                            "with --spot")
    group.add_argument("--max-wait", metavar="DURATION",
                       help="--flex-start only: how long the job waits for its machines, "
                            "e.g. 2h or 3600s (0: indefinitely; Vertex's default is a day)")
    group.add_argument("--restart-on-preemption", action="store_true",
                       help="restart the whole job when a worker restarts or is preempted "
                            "(scheduling.restartJobOnWorkerRestart). train saves a checkpoint "
                            "on SIGTERM and exits 75, and the restarted job resumes from "
                            "JOB_DIR/checkpoints")
    group.add_argument("--timeout", metavar="DURATION",
                       help="the longest the job may run, e.g. 90m, 12h, 3600s (written as "
                            "seconds; Vertex's default is 7 days)")
    group.add_argument("--service-account", metavar="EMAIL",
                       help="the service account the job runs as (required by --tensorboard)")
    group.add_argument("--network", metavar="projects/NUM/global/networks/NAME",
                       help="a VPC network peered with Vertex AI, with the project's number")
    group.add_argument("--persistent-resource-id", metavar="ID",
                       help="run on the machines of this persistent resource (same project "
                            "and region; not with --spot or --flex-start)")
    group.add_argument("--enable-web-access", action="store_true",
                       help="interactive shells into the job's containers")
    group.add_argument("--tensorboard", metavar="projects/P/locations/L/tensorboards/T",
                       help="stream the job's event files (JOB_DIR/logs, written as it "
                            "trains) to this Vertex AI TensorBoard; L must be --region, and "
                            "it needs --service-account")
    group.add_argument("--reduction-server", type=_reducers, metavar="N",
                       help="N Reduction Server reducers in worker pool 2, for GPU workers "
                            "training with multi_worker_mirrored (estimator and keras "
                            "engines; --workers and --accelerator, not --ps); a "
                            "--container-image needs the google-reduction-server package")
    group.add_argument("--reduction-server-machine-type", metavar="TYPE",
                       help="the reducers' CPU machine type (default %s)"
                            % DEFAULT_REDUCTION_SERVER_MACHINE_TYPE)


def vertex_options(args) -> VertexOptions:
    """The VertexOptions of ``args``; UsageError for one given with a target
    other than Vertex AI."""
    options = VertexOptions(
        spot=bool(getattr(args, "spot", False)),
        flex_start=bool(getattr(args, "flex_start", False)),
        max_wait=getattr(args, "max_wait", None),
        restart_on_preemption=bool(getattr(args, "restart_on_preemption", False)),
        timeout=getattr(args, "timeout", None),
        service_account=getattr(args, "service_account", None),
        network=getattr(args, "network", None),
        persistent_resource_id=getattr(args, "persistent_resource_id", None),
        enable_web_access=bool(getattr(args, "enable_web_access", False)),
        tensorboard=getattr(args, "tensorboard", None),
        reduction_server=getattr(args, "reduction_server", None) or 0,
        reduction_server_machine_type=getattr(args, "reduction_server_machine_type", None))
    target = getattr(args, "target", "vertex")
    flags = options.flags()
    if target != "vertex" and flags:
        one = len(flags) == 1
        raise UsageError(
            "%s %s Vertex AI's own (--target vertex): --target %s writes a manifest with no "
            "such fields. Drop %s, or submit to Vertex AI."
            % (flags[0] if one else ", ".join(flags[:-1]) + " and " + flags[-1],
               "is" if one else "are", target, "it" if one else "them"))
    return options
