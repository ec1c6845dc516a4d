"""`rtrec features run|get|load`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import click

from core.settings import Settings
from feature_store.redis_store import RedisFeatureStore
from rtrec.cli.signals import graceful_stop

_JOBMANAGER = click.option("--jobmanager", default=None, metavar="HOST:PORT",
                           help="The session cluster's REST endpoint (default: flink.jobmanager, else the local "
                                "cluster of `features cluster up`).")


@click.group("features")
def features_group() -> None:
    """The windowed feature job and the online feature store."""


def _say_what_happens() -> None:
    """The pipeline's own log at INFO (the loader's partitions, a checkpoint resumed from); other
    libraries' (py4j's calls) only from WARNING."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("rtrec").setLevel(logging.INFO)


@features_group.command("run")
@click.option("--fresh", is_flag=True, help="Ignore retained checkpoints (start from committed group offsets).")
@click.option("--no-loader", is_flag=True, help="Do not feed Redis from the features topic in this process.")
@click.pass_obj
def run(settings: Settings, fresh: bool, no_loader: bool) -> None:
    """Run the feature job on an embedded mini-cluster plus the Redis loader, until SIGTERM or Ctrl-C."""
    _say_what_happens()
    with graceful_stop(60.0) as stop:
        _run_job(settings, fresh, no_loader, stop)
    click.echo("stopped (checkpoints are retained; the next run resumes from the newest)")


def _run_job(settings: Settings, fresh: bool, no_loader: bool, stop: threading.Event) -> None:
    import os

    from feature_store.loader import LoaderConfig, run_loader
    from flink_jobs.monitor import RunningJob, mini_cluster_rest_url
    from flink_jobs.runner import IncompatibleCheckpoint, latest_checkpoint, start_job, unrestorable_state
    from flink_jobs.watch import ENDED, JobWatch

    resumed_from = None if fresh else latest_checkpoint(settings.flink.checkpoint_dir)
    try:
        result = start_job(settings, resume=not fresh)
    except IncompatibleCheckpoint as exc:
        raise click.ClickException(str(exc)) from None
    client = result.get_job_client()
    rest_url = mini_cluster_rest_url(client)
    running = RunningJob(str(client.get_job_id()), rest_url, os.getpid()) if rest_url else None
    if running is not None:
        running.record(settings.flink.checkpoint_dir)
    click.echo(f"feature job {client.get_job_id()} running" + (f", REST API {rest_url}" if rest_url else "")
               + "; Ctrl-C stops it")
    watch = JobWatch(settings, client, rest_url, say=lambda text: click.echo(text, err=True))
    loader, loader_failed = None, []

    def load() -> None:
        try:
            run_loader(LoaderConfig.from_settings(settings),
                       RedisFeatureStore.from_settings(settings.redis, settings.flink),
                       should_stop=stop.is_set, metrics=_loader_metrics(settings))
        except BaseException as exc:  # reported by the main thread, which then ends the process non-zero
            loader_failed.append(exc)

    if not no_loader:
        loader = threading.Thread(target=load, name="redis-loader", daemon=True)
        loader.start()
    try:
        while not stop.wait(1.0):
            if loader_failed:
                raise click.ClickException(f"the Redis loader stopped: {loader_failed[0]}")
            state = watch.tick()
            if resumed_from is not None and watch.restarts and unrestorable_state(watch.cause_seen()):
                raise click.ClickException(str(IncompatibleCheckpoint.of(resumed_from)))
            if state in ENDED:
                raise click.ClickException(f"feature job {'ended' if state == 'GONE' else state}: "
                                           f"{watch.final_cause()}")
    finally:
        stop.set()
        with contextlib.suppress(Exception):  # a job that already ended cannot be cancelled
            client.cancel().result()
        watch.close()
        if running is not None:
            running.forget(settings.flink.checkpoint_dir)
        if loader is not None:
            loader.join(10)


def _loader_metrics(settings: Settings) -> object:
    from feature_store.telemetry import LoaderMetrics

    metrics = LoaderMetrics()
    if settings.flink.loader_metrics_port:
        metrics.serve(settings.flink.loader_metrics_port, settings.services.metrics_host)
    return metrics


@features_group.command("load")
@click.option("--rebuild", is_flag=True, help="Reload the whole features topic (Redis was lost), then go on live.")
@click.option("--idle-exit", "idle_exit_s", type=float, default=None, help="Stop after N seconds without records.")
@click.pass_obj
def load(settings: Settings, rebuild: bool, idle_exit_s: float | None) -> None:
    """Feed Redis from the features topic until SIGTERM or Ctrl-C (add processes to scale by partition).
    Redis restarting is waited out (flink.loader_outage_s); longer, it exits 1 with the cause."""
    from feature_store.loader import LoaderConfig, LoaderError, run_loader

    _say_what_happens()
    with graceful_stop(30.0) as stop:
        try:
            stats = run_loader(LoaderConfig.from_settings(settings, from_beginning=rebuild),
                               RedisFeatureStore.from_settings(settings.redis, settings.flink), should_stop=stop.is_set,
                               idle_exit_s=idle_exit_s, metrics=_loader_metrics(settings))
        except LoaderError as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(f"loaded {stats.records} feature records, {stats.slots_written} slots written")


@features_group.command("get")
@click.argument("entity_type", type=click.Choice(["user", "item", "user_item"]))
@click.argument("ids", nargs=-1, required=True)
@click.option("--names", default="3s.impressions,3s.clicks,60s.impressions,60s.clicks,60s.ctr,600s.ctr",
              show_default=True, help="Comma-separated <horizon>s.<feature> names.")
@click.pass_obj
def get(settings: Settings, entity_type: str, ids: tuple[str, ...], names: str) -> None:
    """Print online features (and each value's window end) from Redis as JSON lines; for users, their
    recent engagements too (null: none written, or expired)."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    store = RedisFeatureStore.from_settings(settings.redis, settings.flink)
    try:
        got = store.get_online_features(entity_type, list(ids), wanted)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    lists = store.get_recent_engagements(list(ids)) if entity_type == "user" else [None] * len(ids)
    for i, entity_id in enumerate(ids):
        values, ends = got.entity(i)
        line: dict[str, object] = {"id": entity_id, "features": values, "window_end_ms": ends}
        if entity_type == "user":
            line["recent"] = None if lists[i] is None else dataclasses.asdict(lists[i])  # type: ignore[arg-type]
        click.echo(json.dumps(line))


@features_group.command("status")
@click.option("--jobmanager", default=None, metavar="HOST:PORT",
              help="Also report the feature job on this session cluster (default: flink.jobmanager, if set).")
@click.pass_obj
def status(settings: Settings, jobmanager: str | None) -> None:
    """The feature job's health (state, restarts and the last failure's cause, last checkpoint, records in
    and out: from the `features run` process of these settings), how far behind the job and the loader
    are (records not yet consumed by their groups) and the newest retained checkpoint, as JSON."""
    from core.kafka import group_lag
    from flink_jobs.monitor import RunningJob, health_or_reason
    from flink_jobs.runner import latest_checkpoint

    k, f = settings.kafka, settings.flink
    checkpoint = latest_checkpoint(f.checkpoint_dir) if f.checkpoint_dir.is_dir() else None
    report = {
        "job": {**health_or_reason(RunningJob.find(f.checkpoint_dir)), "group": f.group_id, "topic": k.topics.events,
                "lag": group_lag(k.bootstrap_servers, f.group_id, k.topics.events, security=k.security.librdkafka())},
        "loader": {"group": f.loader_group_id, "topic": k.topics.features,
                   "lag": group_lag(k.bootstrap_servers, f.loader_group_id, k.topics.features,
                                    security=k.security.librdkafka())},
        "retained_checkpoint": None if checkpoint is None else {"path": str(checkpoint), "age_s": _age_s(checkpoint)},
    }
    for part in ("job", "loader"):
        report[part]["total_lag"] = sum(report[part]["lag"].values())  # type: ignore[index]
    if jobmanager or f.jobmanager:
        report["cluster"] = _cluster_report(settings, jobmanager)
    click.echo(json.dumps(report, indent=2))


def _cluster_report(settings: Settings, jobmanager: str | None) -> dict[str, Any]:
    from flink_jobs.monitor import FlinkRest
    from flink_jobs.session_cluster import SessionCluster, SessionClusterError

    cluster = SessionCluster(jobmanager or settings.flink.jobmanager or "")
    try:
        jobs = {job_id: {**FlinkRest(cluster.url).health(job_id).as_dict(), "parallelism": cluster.parallelism(job_id)}
                for job_id in cluster.running_jobs()}
    except (SessionClusterError, OSError, KeyError, ValueError) as exc:
        return {"url": cluster.url, "error": str(exc)}
    return {"url": cluster.url, "jobs": jobs}


def _age_s(path: Path) -> float | None:
    try:
        return round(time.time() - path.stat().st_mtime, 1)
    except FileNotFoundError:  # the running job replaced it since it was found
        return None


@features_group.group("cluster")
def cluster_group() -> None:
    """A standalone Flink cluster on 127.0.0.1 (the pip package's bin/ scripts), REST on :18081."""


@cluster_group.command("up")
@click.pass_obj
def cluster_up(settings: Settings) -> None:
    from rtrec.services.flink_cluster import FlinkCluster
    from rtrec.services.process import ServiceError

    try:
        click.echo(FlinkCluster(settings.services).start())
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from exc


@cluster_group.command("down")
@click.pass_obj
def cluster_down(settings: Settings) -> None:
    from rtrec.services.flink_cluster import FlinkCluster

    click.echo(FlinkCluster(settings.services).stop())


@cluster_group.command("status")
@click.pass_obj
def cluster_status(settings: Settings) -> None:
    from rtrec.services.flink_cluster import FlinkCluster

    click.echo(FlinkCluster(settings.services).status())


def _session_cluster(settings: Settings, jobmanager: str | None) -> Any:
    """The session cluster named by --jobmanager, else flink.jobmanager, else the local one."""
    from flink_jobs.session_cluster import SessionCluster, SessionClusterError
    from rtrec.services.flink_cluster import FlinkCluster

    address = jobmanager or settings.flink.jobmanager or FlinkCluster(settings.services).rest_url
    cluster = SessionCluster(address)
    try:
        cluster.overview()
    except SessionClusterError as exc:
        hint = "" if jobmanager or settings.flink.jobmanager else "; run `rtrec features cluster up` first"
        raise click.ClickException(f"{exc}{hint}") from exc
    return cluster


def _job_args(no_samples: bool) -> list[str]:
    args = ["--no-samples"] if no_samples else []
    config = click.get_current_context().find_root().params.get("config_file")
    return args + (["--config", str(config)] if config else [])


def _savepoint_dir(settings: Settings) -> str:
    f = settings.flink
    return f.savepoint_dir or (f.checkpoint_dir / "savepoints").resolve().as_uri()


@features_group.command("submit")
@_JOBMANAGER
@click.option("--parallelism", type=int, default=None, help="The job's parallelism (default: the cluster's).")
@click.option("--from-savepoint", "savepoint", default=None, help="Start from this savepoint or checkpoint.")
@click.option("--no-samples", is_flag=True)
@click.pass_obj
def submit(settings: Settings, jobmanager: str | None, parallelism: int | None, savepoint: str | None,
           no_samples: bool) -> None:
    """Submit the job to a Flink 2.2 session cluster: its graph is built here and its jars go with it; the
    cluster needs no Python (every operator runs in the JVM). The job reads its settings from the same
    RTREC_* env vars and --config file as this command."""
    from flink_jobs.access import check_job_acls
    from flink_jobs.session_cluster import SessionClusterError

    check_job_acls(settings.kafka, with_samples=not no_samples)
    cluster = _session_cluster(settings, jobmanager)
    if cluster.running_jobs():
        raise click.ClickException(f"{cluster.url} already runs the feature job {cluster.running_jobs()[0]}; "
                                   "`rtrec features stop` or `rescale` it")
    try:
        job_id = cluster.submit(_job_args(no_samples), {}, parallelism=parallelism, savepoint=savepoint)
    except SessionClusterError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"submitted job {job_id} to {cluster.url}")


@features_group.command("stop")
@_JOBMANAGER
@click.pass_obj
def stop(settings: Settings, jobmanager: str | None) -> None:
    """Stop the job on the session cluster with a savepoint (flink.savepoint_dir) and print where it is:
    `submit --from-savepoint` resumes from it with nothing lost or counted twice."""
    from flink_jobs.session_cluster import SessionClusterError

    cluster = _session_cluster(settings, jobmanager)
    try:
        job_id = cluster.the_job()
        location = cluster.stop_with_savepoint(job_id, _savepoint_dir(settings))
    except SessionClusterError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"stopped job {job_id} with savepoint {location}")


@features_group.command("rescale")
@click.argument("parallelism", type=click.IntRange(1))
@_JOBMANAGER
@click.option("--no-samples", is_flag=True, help="As the running job was submitted.")
@click.pass_obj
def rescale(settings: Settings, parallelism: int, jobmanager: str | None, no_samples: bool) -> None:
    """Stop the job with a savepoint and resubmit it from that savepoint at PARALLELISM."""
    from flink_jobs.session_cluster import SessionClusterError

    cluster = _session_cluster(settings, jobmanager)
    try:
        job_id = cluster.the_job()
        before = cluster.parallelism(job_id)
        location = cluster.stop_with_savepoint(job_id, _savepoint_dir(settings))
        click.echo(f"stopped job {job_id} (parallelism {before}) with savepoint {location}")
        new_id = cluster.submit(_job_args(no_samples), {}, parallelism=parallelism, savepoint=location)
    except SessionClusterError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"resubmitted as job {new_id} at parallelism {parallelism} from {location}")


@features_group.command("backfill")
@click.option("--from", "from_", default=None, help="Start: time (ISO-8601 with zone / epoch ms) or offsets 0:12,1:9.")
@click.option("--to", default=None, help="End (exclusive), same forms; default: the latest offsets now.")
@click.option("--no-samples", is_flag=True, help="Features only, no training samples.")
@click.pass_context
def backfill(ctx: click.Context, from_: str | None, to: str | None, no_samples: bool) -> None:
    """`rtrec backfill` without the trainer (kept as the feature job's own entry)."""
    from rtrec.cli.backfill import backfill_command

    ctx.invoke(backfill_command, from_=from_, to=to, no_samples=no_samples, train=False)
