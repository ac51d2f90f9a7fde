"""Where a study lives: Optuna's storages, one study shared by many ``tune``
commands, and how its trials count toward ``--trials``.

``--storage`` takes

* nothing: a SQLite file in the study's folder (``DIR/study.db``), for the
  ``tune`` commands of one machine;
* an SQLAlchemy URL: ``sqlite:///PATH``, ``postgresql://USER:PASS@HOST/DB``
  (psycopg 3, from the tune extra, unless psycopg2 is installed),
  ``mysql+pymysql://...``: one study for every machine that reaches the
  database;
* ``journal:PATH``: Optuna's journal file on a shared file system (NFS,
  Filestore) where no database is at hand. It has no heartbeat: a trial
  whose worker was killed stays "running" in it and is not retried.

A database storage records a heartbeat for every running trial; a trial
whose worker stops beating (killed, its machine gone) for twice the interval
is marked failed by the next worker that asks for a trial, and run again once
(Optuna's ``RetryFailedTrialCallback``).

``--trials N`` is the study's total, whoever runs it: every original trial
(not a retry) takes one of N places in the order the storage numbered them;
one asked for after the N-th is told failed at once and marked ``surplus``,
and never runs.
"""

import hashlib
import importlib
import json
import os
import time
import warnings
from typing import Dict, List, Optional

from estimator_keras import io
from estimator_keras.errors import ConfigError, UsageError
from estimator_keras.tuning import optuna_search as search

STUDY_DB = "study.db"
DEFINITION_ATTR = "estimator_keras.definition"
SURPLUS_ATTR = "surplus"
DEFAULT_HEARTBEAT_S = 60
# SQLite's wait for a lock another worker holds (the default is 5 s).
_SQLITE_TIMEOUT_S = 60
_CREATE_ATTEMPTS = 4


def default_url(study_dir: str) -> str:
    return "sqlite:///" + os.path.abspath(os.path.join(study_dir, STUDY_DB))


def describe(url: str) -> str:
    """The storage URL without its password, for messages."""
    head, sep, tail = url.partition("://")
    if sep and "@" in tail:
        credentials, host = tail.rsplit("@", 1)
        user = credentials.split(":", 1)[0]
        return f"{head}://{user}:***@{host}" if ":" in credentials else url
    return url


def _driver_url(url: str) -> str:
    """``postgresql://`` means psycopg2 to SQLAlchemy; the tune extra brings
    psycopg 3, so the URL names it when psycopg2 is absent."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        try:
            importlib.import_module("psycopg2")
        except ImportError:
            return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def retry_callback(max_retry: Optional[int] = 1):
    """Optuna's callback that queues a failed trial again (its name before
    Optuna 5.1: ``RetryFailedTrialCallback``)."""
    storages = search.optuna().storages
    return getattr(storages, "RetryHeartbeatStaleTrialCallback",
                   storages.RetryFailedTrialCallback)(max_retry=max_retry)


def open_storage(url: str, heartbeat_s: int = DEFAULT_HEARTBEAT_S):
    """The Optuna storage ``url`` names (see the module's docstring)."""
    optuna = search.optuna()
    if url.startswith("journal:"):
        path = url[len("journal:"):]
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise UsageError("--storage journal:PATH needs the journal file's path, e.g. "
                             "journal:/mnt/shared/study.log.")
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        journal = optuna.storages.journal
        return optuna.storages.JournalStorage(journal.JournalFileBackend(path))
    if "://" not in url:
        raise UsageError(f"--storage {url!r} is not a storage URL; expected sqlite:///PATH, "
                         f"postgresql://USER:PASSWORD@HOST/DB, mysql+pymysql://... or "
                         f"journal:PATH.")
    engine_kwargs = {}
    if url.startswith("sqlite:"):
        engine_kwargs["connect_args"] = {"timeout": _SQLITE_TIMEOUT_S}
        path = url.split(":///", 1)[-1]
        if path and path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    heartbeat = max(1, int(heartbeat_s))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        retry = retry_callback()
    callback = ({"heartbeat_stale_trial_callback": retry}
                if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback")
                else {"failed_trial_callback": retry})
    try:
        for attempt in range(_CREATE_ATTEMPTS):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # Optuna's experimental-feature notices
                    return optuna.storages.RDBStorage(
                        _driver_url(url), engine_kwargs=engine_kwargs,
                        heartbeat_interval=heartbeat, grace_period=2 * heartbeat, **callback)
            except ImportError:
                raise
            except Exception:  # pylint: disable=broad-except
                # Workers started at once race to create a new storage's
                # tables (one finds them made, or its version row taken):
                # opened again, they are there.
                if attempt == _CREATE_ATTEMPTS - 1:
                    raise
                time.sleep(0.5 * (attempt + 1))
    except ImportError as e:
        raise UsageError(f"--storage {describe(url)}: its database driver is not installed "
                         f"({e}). The tune extra brings psycopg for PostgreSQL; for MySQL "
                         f"install PyMySQL and use mysql+pymysql://.") from None
    except Exception as e:  # SQLAlchemy's errors: a server down, bad credentials...
        raise ConfigError(f"--storage {describe(url)}: cannot open the study's storage: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                          ) from None


def heartbeat_enabled(storage) -> bool:
    optuna = search.optuna()
    return (isinstance(storage, optuna.storages.RDBStorage)
            and storage.get_heartbeat_interval() is not None)


def digest(definition: Dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(definition, sort_keys=True).encode()).hexdigest()[:16]


def load_study(storage, name: str, goal: str, sampler, pruner, definition: Dict[str, object],
               where: str):
    """Creates the study ``name`` in ``storage``, or loads it; a study of the
    same name made for another experiment, space or flags is refused."""
    optuna = search.optuna()
    study = optuna.create_study(storage=storage, study_name=name, sampler=sampler,
                                pruner=pruner, load_if_exists=True,
                                direction="maximize" if goal == "max" else "minimize")
    wanted = json.loads(json.dumps(definition))
    recorded = study.user_attrs.get(DEFINITION_ATTR)
    if recorded is None:
        study.set_user_attr(DEFINITION_ATTR, wanted)
        return study
    differ = sorted(k for k in set(wanted) | set(recorded) if wanted.get(k) != recorded.get(k))
    if differ:
        raise ConfigError(
            f"tune: the study {name!r} in {where} was made by another command (its "
            f"{', '.join(differ)} differ from this one's); resume it with the same NAME, "
            f"space and flags, or give another --study-name or --model-dir.")
    direction = "max" if study.direction == optuna.study.StudyDirection.MAXIMIZE else "min"
    if direction != goal:
        raise ConfigError(f"tune: the study {name!r} in {where} has goal {direction}; this "
                          f"command asks for {goal}.")
    return study


def retried_number(trial) -> Optional[int]:
    """The number of the trial ``trial`` retries (None: an original)."""
    return trial.system_attrs.get("failed_trial")


def is_surplus(trial) -> bool:
    return bool(trial.user_attrs.get(SURPLUS_ATTR))


def originals_before(trials: List[object], number: int) -> int:
    """Original trials (not retries) numbered below ``number``. Surplus ones
    count too: each has N originals below it, so counting them changes no
    answer to "are there N below this one"."""
    return sum(1 for t in trials if t.number < number and retried_number(t) is None)


def replaced(trials: List[object]) -> set:
    """Numbers of the trials another trial retries."""
    out = set()
    for t in trials:
        out.update(t.system_attrs.get("retry_history") or ())
    return out


def fail_stale(study) -> None:
    """Marks failed the running trials whose worker stopped beating (and
    queues their retry); a no-op without a heartbeat."""
    optuna = search.optuna()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        optuna.storages.fail_stale_trials(study)


def trial_id(storage, study, number: int) -> int:
    """The storage's id of trial ``number`` (what its public methods take)."""
    study_id = storage.get_study_id_from_name(study.study_name)
    return storage.get_trial_id_from_study_id_trial_number(study_id, number)


def in_study_dir(study_dir: str, url: Optional[str]) -> str:
    """The storage URL a study folder uses (``url`` when given)."""
    if url:
        return url
    if io.is_remote(study_dir):
        raise ConfigError("tune: --model-dir must be a local folder; got %s." % study_dir)
    return default_url(study_dir)
