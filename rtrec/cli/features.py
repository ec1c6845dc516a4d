"""`rtrec features run|get|load`."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import click

from core.settings import Settings
from feature_store.redis_store import RedisFeatureStore
from rtrec.cli.signals import graceful_stop


@click.group("features")
def features_group() -> None:
    """The windowed feature job and the online feature store."""


@features_group.command("run")
@click.option("--fresh", is_flag=True, help="Ignore retained checkpoints (start from committed group offsets).")
@click.option("--no-loader", is_flag=True, help="Do not feed Redis from the features topic in this process.")
@click.pass_obj
def run(settings: Settings, fresh: bool, no_loader: bool) -> None:
    """Run the feature job on an embedded mini-cluster plus the Redis loader, until SIGTERM or Ctrl-C."""
    with graceful_stop(60.0) as stop:
        _run_job(settings, fresh, no_loader, stop)
    click.echo("stopped (checkpoints are retained; the next run resumes from the newest)")


def _run_job(settings: Settings, fresh: bool, no_loader: bool, stop: threading.Event) -> None:
    import os

    from feature_store.loader import LoaderConfig, run_loader
    from flink_jobs.monitor import RunningJob, mini_cluster_rest_url
    from flink_jobs.runner import start_job
    from flink_jobs.watch import ENDED, JobWatch

    result = start_job(settings, resume=not fresh)
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
            run_loader(LoaderConfig.from_settings(settings), RedisFeatureStore.from_settings(settings.redis),
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

    with graceful_stop(30.0) as stop:
        try:
            stats = run_loader(LoaderConfig.from_settings(settings, from_beginning=rebuild),
                               RedisFeatureStore.from_settings(settings.redis), should_stop=stop.is_set,
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
    """Print online features (and each value's window end) from Redis as JSON lines."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    try:
        got = RedisFeatureStore.from_settings(settings.redis).get_online_features(entity_type, list(ids), wanted)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    for i, entity_id in enumerate(ids):
        values, ends = got.entity(i)
        click.echo(json.dumps({"id": entity_id, "features": values, "window_end_ms": ends}))


@features_group.command("status")
@click.pass_obj
def status(settings: Settings) -> None:
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
    click.echo(json.dumps(report, indent=2))


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


@features_group.command("submit")
@click.option("--no-samples", is_flag=True)
@click.pass_obj
def submit(settings: Settings, no_samples: bool) -> None:
    """Submit the same job file to the standalone cluster (`rtrec features cluster up` first).

    The job reads its settings from the same RTREC_* env vars and --config file as this command.
    """
    from rtrec.services.flink_cluster import FlinkCluster
    from rtrec.services.process import ServiceError

    cluster = FlinkCluster(settings.services)
    if not cluster.healthy():
        raise click.ClickException("no Flink cluster answers on :18081; run `rtrec features cluster up` first")
    job_file = Path(__file__).resolve().parents[2] / "flink_jobs" / "submit.py"
    ctx = click.get_current_context()
    args = ["--no-samples"] if no_samples else []
    config = ctx.find_root().params.get("config_file")
    if config:
        args += ["--config", str(config)]
    try:
        click.echo(f"submitted job {cluster.submit(job_file, args)} to {cluster.rest_url}")
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from exc


@features_group.command("backfill")
@click.option("--from", "from_", default=None, help="Start: time (ISO-8601 with zone / epoch ms) or offsets 0:12,1:9.")
@click.option("--to", default=None, help="End (exclusive), same forms; default: the latest offsets now.")
@click.option("--no-samples", is_flag=True, help="Features only, no training samples.")
@click.pass_context
def backfill(ctx: click.Context, from_: str | None, to: str | None, no_samples: bool) -> None:
    """`rtrec backfill` without the trainer (kept as the feature job's own entry)."""
    from rtrec.cli.backfill import backfill_command

    ctx.invoke(backfill_command, from_=from_, to=to, no_samples=no_samples, train=False)
