"""`rtrec demo`: the whole loop on the local services, with a summary and plots."""

from __future__ import annotations

from pathlib import Path

import click

from core.settings import Settings
from rtrec.cli.signals import graceful_stop
from rtrec.services.process import ServiceError


@click.command("demo")
@click.option("--seconds", type=float, default=60.0, show_default=True,
              help="The event time reported on; events go on until the trainer has the samples of all of it.")
@click.option("--rate", type=float, default=2000.0, show_default=True,
              help="Synthetic impressions per second (their clicks come on top).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=Path("demo-out"),
              show_default=True, help="Where the PNG plots go.")
@click.pass_obj
def demo_command(settings: Settings, seconds: float, rate: float, out_dir: Path) -> None:
    """Events -> Flink features and samples -> Redis + Kafka -> trainer -> snapshots; Ctrl-C stops cleanly."""
    from rtrec.demo import run_demo

    try:
        with graceful_stop(120.0, interrupt=True):  # SIGTERM as Ctrl-C: the demo stops cleanly and reports
            r = run_demo(settings, seconds, rate, say=click.echo, out_dir=out_dir)
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo("\n== summary ==")
    click.echo(f"run               {r.run_id}")
    click.echo(f"events            {r.events}")
    click.echo(f"feature windows   {r.feature_records} records on the features topic")
    click.echo(f"features in Redis {r.redis_keys} entities ({r.redis_slots} window slots written)")
    click.echo(f"training samples  {r.samples} ({r.samples_trained} trained)")
    click.echo(f"dead letters      {r.dead_letters}")
    c = r.comparison
    if c is not None and c.samples:
        def auc_text(value: float | None) -> str:
            return "  -  " if value is None else f"{value:.3f}"

        click.echo(f"AUC, same samples {c.samples} samples after snapshot v{c.frozen_version}"
                   + (f" ({c.unscored} more never reached the trainer)" if c.unscored else ""))
        click.echo(f"  real-time model {auc_text(c.realtime_auc)}  per bucket "
                   + " ".join(auc_text(b.realtime) for b in c.buckets))
        click.echo(f"  frozen v{c.frozen_version:<8} {auc_text(c.frozen_auc)}  per bucket "
                   + " ".join(auc_text(b.frozen) for b in c.buckets))
    click.echo(f"snapshots         {len(r.snapshots)} written, promoted {r.promoted}")
    for line in r.freshness.lines():
        click.echo(f"feature freshness window close -> Redis, {line}")
    for line in r.freshness.at_loader_lines():  # the job's and Kafka's part; the rest is the loader's writes
        click.echo(f"feature freshness window close -> loader, {line}")
    if r.trainer_freshness_s is not None:
        click.echo(f"model freshness   newest event in the current snapshot was {r.trainer_freshness_s:.1f}s old")
    for path in r.plots:
        click.echo(f"plot              {path}")
    if r.trainer_error:
        raise click.ClickException(f"the trainer failed: {r.trainer_error}")
    if not r.samples or not r.promoted:
        raise click.ClickException("the loop did not complete: no samples or no promoted snapshot")
