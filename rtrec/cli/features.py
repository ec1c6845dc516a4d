"""`rtrec features run|get|load`."""

from __future__ import annotations

import json
import signal
import sys
import threading

import click

from feature_store.redis_store import RedisFeatureStore
from rtrec.settings import Settings


def _store(settings: Settings) -> RedisFeatureStore:
    return RedisFeatureStore(settings.redis.url, settings.redis.key_prefix, settings.redis.ttl_s)


@click.group("features")
def features_group() -> None:
    """The windowed feature job and the online feature store."""


@features_group.command("run")
@click.option("--fresh", is_flag=True, help="Ignore retained checkpoints (start from committed group offsets).")
@click.option("--no-loader", is_flag=True, help="Do not feed Redis from the features topic in this process.")
@click.pass_obj
def run(settings: Settings, fresh: bool, no_loader: bool) -> None:
    """Run the feature job on an embedded mini-cluster plus the Redis loader, until Ctrl-C."""
    from feature_store.loader import run_loader
    from flink_jobs.runner import start_job

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    result = start_job(settings, resume=not fresh)
    client = result.get_job_client()
    click.echo(f"feature job {client.get_job_id()} running; Ctrl-C stops it")
    loader = None
    if not no_loader:
        k = settings.kafka
        loader = threading.Thread(target=run_loader, daemon=True, kwargs={
            "bootstrap": k.bootstrap_servers, "topic": k.topics.features, "dead_letter_topic": k.topics.dead_letter,
            "group_id": settings.flink.loader_group_id, "store": _store(settings), "batch": settings.flink.loader_batch,
            "should_stop": stop.is_set, "partitions": k.partitions,
            "isolation_level": settings.flink.loader_isolation})
        loader.start()
    try:
        while not stop.wait(1.0):
            if str(client.get_job_status().result()) in ("FAILED", "CANCELED", "FINISHED"):
                raise click.ClickException(f"feature job ended: {client.get_job_status().result()}")
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        client.cancel().result()
        if loader is not None:
            loader.join(10)
    click.echo("stopped (checkpoints are retained; the next run resumes from the newest)")


@features_group.command("load")
@click.pass_obj
def load(settings: Settings) -> None:
    """Feed Redis from the features topic until Ctrl-C (add processes to scale by partition)."""
    from feature_store.loader import run_loader

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    k = settings.kafka
    try:
        stats = run_loader(k.bootstrap_servers, k.topics.features, k.topics.dead_letter,
                           settings.flink.loader_group_id, _store(settings), settings.flink.loader_batch,
                           should_stop=stop.is_set, partitions=k.partitions,
                           isolation_level=settings.flink.loader_isolation)
    except KeyboardInterrupt:
        return
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
        got = _store(settings).get_online_features(entity_type, list(ids), wanted)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    for i, entity_id in enumerate(ids):
        values, ends = got.entity(i)
        click.echo(json.dumps({"id": entity_id, "features": values, "window_end_ms": ends}))


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
    from pathlib import Path

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
@click.pass_obj
def backfill(settings: Settings, from_: str | None, to: str | None, no_samples: bool) -> None:
    """Run the job bounded over a historical range; features reach Redis without clobbering newer values."""
    import time as _time

    from tqdm import tqdm

    from feature_store.loader import run_loader
    from flink_jobs.backfill import startup_options
    from flink_jobs.runner import start_job

    try:
        startup = startup_options(from_, to)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    run_id = f"backfill-{int(_time.time())}"
    s = settings.model_copy(update={"flink": settings.flink.model_copy(update={
        "group_id": f"rtrec-{run_id}", "checkpoint_dir": settings.flink.checkpoint_dir / run_id})})
    result = start_job(s, resume=False, startup=startup, job_id=run_id, with_samples=not no_samples)
    click.echo(f"backfill job {result.get_job_client().get_job_id()} over {startup}")
    outcome: list[BaseException | None] = []

    def wait() -> None:
        try:
            result.wait()
            outcome.append(None)
        except BaseException as exc:  # surfaced below with the log location
            outcome.append(exc)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    with tqdm(desc="backfill running", unit="s", file=sys.stderr) as bar:
        while waiter.is_alive():
            waiter.join(1.0)
            bar.update(1)
    if outcome and outcome[0] is not None:
        raise click.ClickException(f"backfill job failed: {outcome[0]}; see {s.flink.log_dir}")
    k = s.kafka
    stats = run_loader(k.bootstrap_servers, k.topics.features, k.topics.dead_letter, s.flink.loader_group_id,
                       _store(s), s.flink.loader_batch, idle_exit_s=3.0, partitions=k.partitions)
    click.echo(f"backfill finished: {stats.records} feature records loaded, {stats.slots_written} Redis slots "
               "updated (older windows never overwrite newer ones)")
