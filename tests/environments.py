"""What each tox environment runs, and the only cases it may skip.

CI runs tox's envlist (py311, keras, py313, extras, in that order: tests that
move weights between engines start the envs' interpreters built before
theirs, and extras checks that the envs together run every case, by
collecting each env's cases in its own interpreter). Each environment runs the test
modules listed for it, the keras3 engine on the backends listed for it, and
tests the CLI's guarantees on the ``engines`` listed for it (see
:func:`engines_under_test`), and may skip exactly the cases in its ``skips``: a case that cannot run there
(no tf.estimator on TensorFlow 2.21, no Keras 3 on 2.15, no JAX where the
Quickstart installs none). Any other skip fails the run (tests/conftest.py),
and ``tests/test_environments.py`` checks that the environments together run
every module, both backends and every skipped case.

``TOX_ENV_NAME`` (set by tox) names the environment; ``EK_TEST_ENV``
overrides it. Outside tox neither is set: pytest then runs what it is given
and skips what this interpreter cannot run, without the check.
"""

import collections
import fnmatch
import os

Environment = collections.namedtuple("Environment",
                                     "description modules engines backends skips only")
# ``only``: for a module another environment runs in full, the cases (names
# with or without their parameters, fnmatch patterns) this one runs of it: those that need what only this
# environment has. The rest is deselected here.

# The gallery's cases of one Keras: the keras engine's refusal of Keras 3
# models needs tf-keras beside Keras 3 (the keras env).
_GALLERY_ON_ONE_KERAS = ("test_a_keras_io_model_trains_evaluates_exports_and_predicts",
                         "test_the_module_lists_the_four_models")
# And the keras3 engine's exports of a user's class, on Keras 3 (py313).
_GALLERY_ON_KERAS_3 = _GALLERY_ON_ONE_KERAS + (
    "test_the_exports_serve_a_user_class_that_overrides_call_through_its_call",
    "test_the_savedmodel_child_of_a_dead_parent_ends_before_it_imports_*")

# Remote paths without TensorFlow: fsspec comes with the jax extra.
_THROUGH_FSSPEC = ("test_remote_paths_without_tensorflow_go_through_fsspec",
                   "test_a_dataset_is_written_and_verified_through_fsspec")

# The environments that install no TensorFlow (their tests check that nothing needs it).
WITHOUT_TENSORFLOW = ("jax",)

ENVIRONMENTS = {
    "py311": Environment(
        "Python 3.11, TensorFlow 2.15 with tf.estimator and its own Keras 2: the estimator "
        "engine and its moves to the keras engine, the cloud targets, the docs build",
        modules=(
            # The data layer (records, inputs, sources, manifests, caches) and the
            # user's-data walkthroughs (prepare, train, predict) run in py313, on
            # the TensorFlow and engine the Quickstart gives; here the data layer
            # runs under every estimator run.
            "test_benchmarks.py", "test_built_once.py", "test_checkpoints.py", "test_cli.py",
            "test_cli_usage.py", "test_cloud.py", "test_cluster.py", "test_cluster_checks.py",
            "test_cluster_network.py", "test_cluster_preemption.py", "test_distributed.py",
            "test_docs.py", "test_embeddings.py", "test_engine_interface.py",
            "test_environments.py", "test_error_causes.py", "test_export.py", "test_fuzz.py",
            "test_jaxjob.py", "test_keras3_setup.py", "test_keras_engine.py", "test_layout.py",
            "test_learning_rate.py", "test_live_summaries.py", "test_memory.py",
            "test_modeldir_lock.py", "test_output.py", "test_package.py", "test_plugins.py",
            "test_plugins_cluster.py", "test_precision.py", "test_preemption.py",
            "test_preemption_tasks.py", "test_reliability.py", "test_exact_resume.py",
            "test_input_order.py", "test_order_changes.py",
            "test_resume_random_layers.py", "test_katib_rules.py",
            "test_submit_flags.py", "test_tune.py", "test_tune_trials.py",
            "test_tuning_table.py", "test_vector_data.py",
            "test_messages.py", "test_one_input_models.py", "test_exit.py",
            "test_engine_house.py", "test_a_fourth_engine.py", "test_tune_engines.py",
            "test_trainjob_status.py",
            "test_vertex_requests.py",
            "test_trainjob.py", "test_tfrecord_frames.py", "test_example_codec.py",
            "test_record_index.py",
            # prepare, inspect and verify with TensorFlow made unimportable,
            # against TensorFlow 2.15's bytes.
            "test_without_tensorflow.py",
            # Apache Beam installs here without moving TensorFlow, protobuf or
            # numpy (on 3.13 it would pin numpy < 2.5 and protobuf < 7).
            "test_prepare_beam.py", "test_keras_io_gallery.py",
        ),
        # The keras engine's guarantees run in the keras env (TensorFlow 2.21).
        engines=("estimator",),
        backends=(),
        skips={
            **{f"tests/test_keras3_setup.py::{name}": "Keras 3 needs TensorFlow 2.16+"
               for name in ("test_auto_follows_tf_keras_and_keras3_model_dirs",
                            "test_keras3_wins_over_the_legacy_variable_the_package_sets",
                            "test_keras_engine_keeps_tf_keras",
                            "test_keras3_after_tensorflow_handed_out_keras2_is_refused",
                            "test_backend_change_after_keras_import_is_refused",
                            "test_cli_unknown_backend",
                            "test_cli_backend_not_installed_names_the_extra",
                            "test_cli_list_still_answers_and_tune_refuses_up_front",
                            "test_a_model_mixing_keras2_and_keras3_is_refused")},
            "tests/test_messages.py::test_cli_refuses_torch_before_any_work":
                "Keras 3 needs TensorFlow 2.16+",
            "tests/test_cli.py::test_tune_without_the_tune_extra_names_it":
                "Optuna is installed (the tune extra): this case needs an environment "
                "without it",
            "tests/test_messages.py::test_jax_on_the_cpu_warns_for_convolutions_only":
                "Keras 3 needs TensorFlow 2.16+",
            "tests/test_embeddings.py::*[[]keras-mwms[]]":
                "the keras engine's embeddings across workers run in the keras env",
            "tests/test_trainjob.py::test_three_pods_given_a_trainjobs_environment_train_as_one_"
            "cluster[[]keras*[]]": "the keras and keras3 engines' TrainJob pods run in the keras "
                                   "env",
        },
        # The keras engine's own module runs in the keras env, on TensorFlow
        # 2.21; here only its moves from the estimator engine, which need both.
        only={"test_keras_io_gallery.py": _GALLERY_ON_ONE_KERAS,
              "test_keras_engine.py": ("test_estimator_model_dir_moves_to_the_keras_engine",
                                       "test_weights_h5_move_between_the_engines_models"),
              # Tuning on the newer engines runs in the keras env.
              "test_tune_engines.py": ("*[[]estimator[]]",),
              # The rest runs the keras3 engine, in py313.
              "test_order_changes.py": (
                  "test_a_parameter_server_cluster_resumes_each_worker_at_a_fresh_epoch",),
              # Beam's command line and its failures on Python 3.11; the
              # datasets it writes, compared with the built-in writer's, in extras.
              "test_prepare_beam.py": (
                  "test_beam_options_need_beam_and_other_arguments_are_still_refused",
                  "test_without_beam_the_command_names_the_extra",
                  "test_the_cli_loads_beam_only_for_beam",
                  "test_local_runs_default_to_the_fn_api_runner_with_num_workers",
                  "test_a_failed_force_rewrite_leaves_the_dataset_that_was_there",
                  "test_a_workers_error_fails_the_command_naming_the_runner_and_the_file")},
    ),
    "keras": Environment(
        "Python 3.13 with '.[cpu,jax]' and tf-keras: the keras engine on TensorFlow 2.21, the "
        "keras3 engine on JAX, Keras 3 across JAX processes",
        modules=(
            # Keras 2 from tf-keras on TensorFlow 2.21 (--engine auto is keras
            # here: TF_USE_LEGACY_KERAS=1), and Keras 3 on JAX, in one process
            # and across processes.
            "test_benchmarks_keras.py", "test_cli.py", "test_cluster.py",
            "test_cluster_checks.py", "test_cluster_preemption.py", "test_distributed.py",
            "test_embeddings.py", "test_engine_interface.py", "test_environments.py",
            "test_error_causes.py", "test_jax_cluster.py", "test_jax_processes.py",
            "test_keras3_cli.py", "test_keras3_engine.py", "test_keras3_export.py",
            "test_keras3_migration.py", "test_keras3_setup.py", "test_keras_engine.py",
            "test_learning_rate.py", "test_live_summaries.py", "test_messages.py",
            "test_modeldir_lock.py", "test_one_input_models.py", "test_output.py",
            "test_plugins.py", "test_plugins_cluster.py", "test_precision.py",
            "test_preemption.py", "test_preemption_tasks.py", "test_reliability.py",
            "test_built_once.py", "test_builders_keras3.py", "test_tune_engines.py",
            "test_trainjob_status.py",
            "test_trainjob.py", "test_tracking.py", "test_exact_resume.py",
            "test_keras_io_gallery.py", "test_io.py",
            # The Grain pipeline, against tf.data's batches.
            "test_grain_inputs.py",
        ),
        engines=("keras",),
        backends=("jax",),
        skips={
            **{pattern: "tf.estimator ends with TensorFlow 2.15" for pattern in (
                "tests/test_distributed.py::test_parameter_server_cluster_with_evaluator",
                "tests/test_distributed.py::test_multi_worker_mirrored_export_equals_last_checkpoint",
                "tests/test_distributed.py::*[[]*estimator[]]",
                "tests/test_distributed.py::"
                "test_a_chief_that_never_writes_the_initial_weights_is_a_model_dir_error",
                "tests/test_distributed.py::"
                "test_an_async_worker_whose_step_ends_with_the_chiefs_training_ends_cleanly",
                "tests/test_embeddings.py::*estimator*",
                "tests/test_keras_engine.py::test_estimator_model_dir_moves_to_the_keras_engine",
                "tests/test_keras_engine.py::test_weights_h5_move_between_the_engines_models",
                "tests/test_live_summaries.py::*[[]estimator[]]",
                "tests/test_preemption_tasks.py::*[[]estimator-*]")},
            "tests/test_one_input_models.py::*[[]estimator[]]":
                "tf.estimator ends with TensorFlow 2.15",
            "tests/test_engine_interface.py::*[[]estimator[]]":
                "tf.estimator ends with TensorFlow 2.15",
            "tests/test_tune_engines.py::*[[]estimator[]]":
                "tf.estimator ends with TensorFlow 2.15",
            "tests/test_cli.py::test_tune_without_the_tune_extra_names_it":
                "Optuna is installed (the tune extra): this case needs an environment "
                "without it",
            "tests/test_keras3_setup.py::test_cli_keras3_without_keras3":
                "Keras 3 is installed: this case needs an environment without it",
            "tests/test_keras3_setup.py::test_cli_backend_not_installed_names_the_extra":
                "JAX is installed: this case needs an environment without a training backend",
        },
        only={"test_trainjob.py": (
            "test_three_pods_given_a_trainjobs_environment_train_as_one_cluster[[]keras[]]",
            "test_three_pods_given_a_trainjobs_environment_train_as_one_cluster[[]keras3[]]"),
              # Remote paths through fsspec, which the jax extra brings.
              "test_io.py": _THROUGH_FSSPEC},
    ),
    "py313": Environment(
        "Python 3.13 with exactly '.[cpu]' and the test tools, as the Quickstart installs it: "
        "TensorFlow 2.21 and Keras 3, the keras3 engine on TensorFlow, the data layer",
        modules=(
            # The Quickstart's path: every engine-facing guarantee, example and
            # command on the keras3 engine, and the data layer on TensorFlow 2.21.
            "test_builders_keras3.py", "test_built_once.py", "test_caches.py",
            "test_cli.py", "test_cli_usage.py", "test_docs.py",
            "test_engine_interface.py", "test_environments.py", "test_error_causes.py",
            "test_exit.py", "test_inputs.py", "test_io.py", "test_keras3_cli.py",
            "test_keras3_engine.py", "test_keras3_setup.py", "test_layout.py",
            "test_manifest.py", "test_messages.py",
            "test_model_dir_guarantees.py", "test_modeldir_lock.py", "test_one_input_models.py",
            "test_output.py", "test_plugins.py", "test_precision.py", "test_preemption.py",
            "test_prepare_files.py", "test_records.py", "test_reliability.py",
            "test_sources.py", "test_your_data.py", "test_engine_house.py",
            "test_a_fourth_engine.py", "test_exact_resume.py", "test_input_order.py",
            "test_resume_random_layers.py", "test_first_hour.py",
            # Starts the py311 and keras envs' interpreters (tests/keras_envs.py).
            "test_optimizer_moves.py",
            "test_order_changes.py", "test_logits.py", "test_keras_io_gallery.py",
            # TFRecords without TensorFlow, against TF 2.21 and protobuf 7, and
            # the CLI's data commands with TensorFlow made unimportable.
            "test_tfrecord_frames.py", "test_example_codec.py", "test_record_index.py",
            "test_without_tensorflow.py",
        ),
        engines=("keras3",),
        backends=("tensorflow",),
        skips={
            "tests/test_docs.py::test_the_docs_build_strictly":
                "MkDocs comes with the docs extra, which the Quickstart does not install",
            "tests/test_docs.py::test_the_pages_examples_run[[]docs/howto/tuning.md[]]":
                "the page runs `tune`, which needs the tune extra (Optuna); the Quickstart "
                "does not install it",
            "tests/test_docs.py::test_the_pages_examples_run[[]docs/howto/tracking.md[]]":
                "the page tracks runs with --track, which needs the mlflow extra; the "
                "Quickstart does not install it",
            "tests/test_first_hour.py::test_track_says_the_run_is_recorded_only_once_mlflow_has_it":
                "--track needs the mlflow extra; the Quickstart does not install it",
            "tests/test_a_fourth_engine.py::test_the_docs_engine_table_has_its_column":
                "MkDocs comes with the docs extra, which the Quickstart does not install",
            "tests/test_engine_interface.py::*[[]estimator[]]":
                "tf.estimator ends with TensorFlow 2.15",
            "tests/test_order_changes.py::"
            "test_a_parameter_server_cluster_resumes_each_worker_at_a_fresh_epoch":
                "tf.estimator ends with TensorFlow 2.15",
            "tests/test_error_causes.py::test_an_error_in_a_cluster_task_names_the_task*":
                "the keras3 engine trains several processes on JAX only",
            "tests/test_one_input_models.py::*[[]estimator[]]":
                "tf.estimator ends with TensorFlow 2.15",
            "tests/test_one_input_models.py::*[[]keras[]]": "no tf-keras",
            "tests/test_keras3_setup.py::test_keras_engine_keeps_tf_keras": "no tf-keras",
            "tests/test_keras3_setup.py::test_keras3_after_tensorflow_handed_out_keras2_is_refused":
                "no tf-keras",
            "tests/test_keras3_setup.py::test_a_model_mixing_keras2_and_keras3_is_refused":
                "no tf-keras",
            "tests/test_keras3_setup.py::test_backend_change_after_keras_import_is_refused":
                "no JAX",
            "tests/test_keras3_setup.py::test_cli_keras3_without_keras3":
                "Keras 3 is installed: this case needs an environment without it",
            **{f"tests/test_io.py::{name}": "fsspec comes with the jax extra, which the "
                                            "Quickstart does not install"
               for name in _THROUGH_FSSPEC},
        },
        only={"test_keras_io_gallery.py": _GALLERY_ON_KERAS_3},
    ),
    "jax": Environment(
        "Python 3.13 with exactly '.[jax]' and the test tools, no TensorFlow: the records "
        "written, read and verified without it, the Grain input pipeline, and the keras3 "
        "engine on JAX training, resuming, exporting and clustering without it",
        # (tfrecord_frames and example_codec are compared with TensorFlow's
        # bytes, in py311 and py313.)
        modules=("test_record_index.py", "test_grain_inputs.py", "test_without_tensorflow.py",
                 "test_train_without_tensorflow.py", "test_layout.py"),
        engines=("keras3",),
        backends=("jax",),
        skips={pattern: "compared with TensorFlow's own results, which need TensorFlow: "
                        "py313 and the keras env run it"
               for pattern in (
                   "tests/test_grain_inputs.py::test_the_batches_are_tf_data_s_*",
                   # (the backend Grain does not feed is TensorFlow's)
                   "tests/test_grain_inputs.py::"
                   "test_train_refuses_grain_where_it_does_not_feed_the_backend",
                   "tests/test_record_index.py::test_tensorflows_own_files_read_the_same_by_index*",
                   "tests/test_without_tensorflow.py::test_pillow_finds_the_pngs_tensorflow_refuses*",
                   "tests/test_without_tensorflow.py::"
                   "test_pillow_finds_the_truncated_jpegs_tensorflow_refuses*",
                   "tests/test_without_tensorflow.py::test_mask_class_ids_are_tensorflows_without_it")},
        only={"test_layout.py": ("test_light_modules_do_not_import_tensorflow",)},
    ),
    "extras": Environment(
        "Python 3.13 with the Quickstart's '.[cpu]' and the extras its users add (beam, "
        "mlflow): `prepare --beam` on 3.13, the tracking page and tracking's bounds on the "
        "keras3 engine; and the check that the envs together run every case",
        modules=("test_prepare_beam.py", "test_docs.py", "test_environments_cover.py",
                 "test_tracking_bounds.py", "test_first_hour.py"),
        engines=("keras3",),
        backends=("tensorflow",),
        skips={},
        only={"test_docs.py": ("test_the_pages_examples_run[[]docs/howto/tracking.md[]]",),
              "test_first_hour.py": ("test_track_says_the_run_is_recorded_only_once_mlflow_has_it",)},
    ),
}


def current():
    """(name, :class:`Environment`) of the environment running the tests,
    or (None, None) outside tox."""
    name = os.environ.get("EK_TEST_ENV") or os.environ.get("TOX_ENV_NAME")
    return (name, ENVIRONMENTS[name]) if name in ENVIRONMENTS else (None, None)


def engines_under_test():
    """The engines whose CLI cases this environment runs: its ``engines``, or
    outside tox every engine this interpreter can run."""
    if ENV is not None:
        return list(ENV.engines)
    from estimator_keras import engines  # pylint: disable=import-outside-toplevel
    return [name for name, ok, _ in engines.statuses() if ok]


def expected_skip(environment, nodeid):
    """The reason ``environment`` gives for skipping ``nodeid``, or None."""
    for pattern, reason in environment.skips.items():
        if fnmatch.fnmatchcase(nodeid, pattern):
            return reason
    return None


# -- pytest hooks (a plugin: tests/conftest.py loads this module) -------------

ENV_NAME, ENV = current()
_UNEXPECTED_SKIPS = []


def pytest_configure(config):
    config.addinivalue_line("markers", "keras3_backend(name): a case of the keras3 engine on "
                                       "that Keras backend (tests/environments.py)")


def pytest_ignore_collect(collection_path, config):
    """Test modules that another environment runs."""
    del config
    name = collection_path.name
    if ENV is None or not (name.startswith("test_") and name.endswith(".py")):
        return None
    return True if name not in ENV.modules else None


def runs_elsewhere(environment, item):
    """Whether another environment runs this case: the keras3 engine on a
    backend ``environment`` does not run, a case of a Keras 2 engine (an
    ``engine`` parameter) it does not test, or one its ``only`` leaves out."""
    mark = item.get_closest_marker("keras3_backend")
    if mark is not None and mark.args[0] not in environment.backends:
        return True
    engine = getattr(item, "callspec", None) and item.callspec.params.get("engine")
    if engine in ("estimator", "keras") and engine not in environment.engines:
        return True
    cases = environment.only.get(item.path.name)
    return cases is not None and not any(
        fnmatch.fnmatchcase(item.originalname, pattern) or fnmatch.fnmatchcase(item.name, pattern)
        for pattern in cases)


def pytest_collection_modifyitems(config, items):
    """Cases that another environment runs are deselected here."""
    if ENV is None:
        return
    kept, other = [], []
    for item in items:
        (other if runs_elsewhere(ENV, item) else kept).append(item)
    if other:
        config.hook.pytest_deselected(items=other)
        items[:] = kept


def pytest_runtest_logreport(report):
    if ENV is None or not report.skipped or hasattr(report, "wasxfail"):
        return
    if expected_skip(ENV, report.nodeid) is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        _UNEXPECTED_SKIPS.append((report.nodeid, str(reason)))


def pytest_collectreport(report):
    """A module that skips itself as it is imported."""
    pytest_runtest_logreport(report)


def pytest_sessionfinish(session, exitstatus):
    """A skip this environment does not list fails the run: it could hide a
    case that no environment runs."""
    if _UNEXPECTED_SKIPS and exitstatus in (0, 5):
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter):
    if _UNEXPECTED_SKIPS:
        terminalreporter.section(f"skips that tests/environments.py does not list for {ENV_NAME}")
        for nodeid, reason in _UNEXPECTED_SKIPS:
            terminalreporter.line(f"{nodeid}: {reason}")
