"""`rtrec demo`: services up, synthetic events produced, consumed back, summary printed."""

from __future__ import annotations

import time
from collections import Counter

import click

from rtrec.services import manager
from rtrec.services.process import ServiceError
from rtrec.settings import Settings
from rtrec.sources.produce import produce_synthetic
from schemas.kafka_io import read_topic


@click.command("demo")
@click.option("-n", "--events", type=int, default=50_000, show_default=True)
@click.option("--keep-services/--stop-services", default=True, show_default=True,
              help="Leave Kafka and Redis running afterwards.")
@click.pass_obj
def demo_command(settings: Settings, events: int, keep_services: bool) -> None:
    """Run the local streaming demo end to end and print a summary."""
    try:
        for name, text in manager.up(settings.services).items():
            click.echo(f"[services] {name}: {text}")
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        started_ms = int(time.time() * 1000)
        click.echo(f"[produce] {events} synthetic events -> {settings.kafka.topics.events}")
        produced = produce_synthetic(settings, events, start_ms=started_ms)
        run_prefix = f"syn{settings.synthetic.seed}-{started_ms}-"
        began = time.monotonic()
        # The topic may hold earlier runs' events: read all of it, count this run's by event id.
        batch = read_topic(settings.kafka.bootstrap_servers, settings.kafka.topics.events, "InteractionEvent")
        mine = Counter(r["event_type"] for r in batch.records if r["event_id"].startswith(run_prefix))
        total = len(batch.records)
        consumed_s = time.monotonic() - began
        click.echo("\n== summary ==")
        click.echo(f"produced      {produced.produced} events in {produced.seconds:.1f}s ({produced.rate:,.0f} ev/s)")
        click.echo(f"consumed back {sum(mine.values())} of this run's events ({total} in topic) in {consumed_s:.1f}s")
        click.echo("by type       " + ", ".join(f"{k}={v}" for k, v in sorted(mine.items())))
        if sum(mine.values()) != produced.produced:
            raise click.ClickException(f"consumed {sum(mine.values())} events, produced {produced.produced}")
    finally:
        if not keep_services:
            manager.down(settings.services)
