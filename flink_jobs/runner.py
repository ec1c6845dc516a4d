"""Running the feature job: embedded mini-cluster (in this process), resuming from the newest
retained checkpoint unless told to start fresh."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from core.kafka import ensure_topics
from core.log_range import LogRange
from core.settings import Settings
from flink_jobs.access import check_job_acls, job_topic_needs
from flink_jobs.environment import table_environment
from flink_jobs.feature_job import build_job

log = logging.getLogger("rtrec.flink")


class IncompatibleCheckpoint(RuntimeError):
    """The newest checkpoint holds state the job being started cannot take: of operators it does not
    have (the start fails), or of a type its operators no longer keep (each restore fails, and a
    restart never changes that)."""

    @classmethod
    def of(cls, checkpoint: Path) -> IncompatibleCheckpoint:
        return cls(f"checkpoint {checkpoint} was written by a job of another shape (other windows, horizons or "
                   "flink.config, or an earlier build), so its state does not map onto this one. Run with the "
                   "settings it was written with, or with --fresh: the job then starts from the consumer "
                   "group's committed offsets, and the windows open at that checkpoint count only what follows")


def unrestorable_state(cause: str | None) -> bool:
    """Whether a failure's cause says that state in the checkpoint is of a type this job's operators no
    longer keep (e.g. a function's accumulator changed between builds).

    >>> unrestorable_state("org.apache.flink.util.StateMigrationException: For heap backends, the new state "
    ...                    "serializer (...) must not be incompatible with the old state serializer (...)")
    True
    >>> unrestorable_state("java.io.IOException: No space left on device"), unrestorable_state(None)
    (False, False)
    """
    return cause is not None and "StateMigrationException" in cause


def latest_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The newest complete checkpoint (`<dir>/<job id>/chk-N/_metadata`) of any earlier run."""
    newest, newest_mtime = None, -1.0
    for metadata in checkpoint_dir.glob("*/chk-*/_metadata"):
        try:
            mtime = metadata.stat().st_mtime
        except FileNotFoundError:  # a running job dropped it for a newer one since the listing
            continue
        if mtime > newest_mtime:
            newest, newest_mtime = metadata.parent, mtime
    return newest


def start_job(settings: Settings, resume: bool = True, log_range: LogRange | None = None,
              job_id: str = "features", with_samples: bool = True, streaming: bool = True) -> Any:
    """Submits the job to the embedded mini-cluster and returns its TableResult (the job runs on).

    Without `log_range` the job runs live from the group's offsets; with one it reads that range and ends.
    A missing Kafka ACL raises KafkaAuthorizationError before anything starts; the topics it reads and
    writes are created when they do not exist yet."""
    k = settings.kafka
    check_job_acls(k, with_samples=with_samples)
    # on a topic that does not exist yet the job restarts on UnknownTopicOrPartition until it gives up
    ensure_topics(k.bootstrap_servers, list(job_topic_needs(k, with_samples)), k.partitions,
                  security=k.security.librdkafka())
    t_env = table_environment(settings, streaming=streaming)
    if log_range is not None:
        # A bounded replay runs hours of event time per second: a partition that pauses for the idle
        # timeout would let the others push the watermark past everything it still holds (seen here:
        # 1,537 of 60,287 replayed events dead-lettered as late). The end of input flushes every window.
        t_env.get_config().set("table.exec.source.idle-timeout", "0 ms")
    checkpoint = latest_checkpoint(settings.flink.checkpoint_dir) if resume else None
    if checkpoint is not None:
        log.info("resuming from checkpoint %s", checkpoint)
        t_env.get_config().set("execution.state-recovery.path", str(checkpoint))
    statements = build_job(settings, t_env, log_range=log_range, job_id=job_id, with_samples=with_samples)
    try:
        return statements.execute()
    except Exception as exc:
        # Flink SQL keeps no state compatibility across plans: other windows, horizons or flink.config
        # (such as the aggregation phases, README "One-phase window aggregation") give other operators
        if checkpoint is not None and "Cannot map checkpoint/savepoint state" in str(exc):
            raise IncompatibleCheckpoint.of(checkpoint) from None
        raise
