"""`rtrec backfill --from ... --to ... [--train]`."""

from __future__ import annotations

import click

from core.log_range import LogRange
from core.settings import Settings


@click.command("backfill")
@click.option("--from", "from_", default=None, help="Start: time (ISO-8601 with zone / epoch ms) or offsets 0:12,1:9.")
@click.option("--to", default=None, help="End (exclusive), same forms; default: the latest offsets now.")
@click.option("--no-samples", is_flag=True, help="Features only, no training samples.")
@click.option("--train", is_flag=True, help="Also train a model on the range's samples (its own snapshots).")
@click.pass_obj
def backfill_command(settings: Settings, from_: str | None, to: str | None, no_samples: bool, train: bool) -> None:
    """Replay a historical range of the interactions topic through the features (into Redis, newer
    values kept) and, with --train, the trainer, without touching the live model or live topics."""
    from rtrec.backfill import BackfillError, run_backfill

    try:
        log_range = LogRange.parse(from_, to)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    try:
        result = run_backfill(settings, log_range, with_samples=not no_samples, train=train,
                              say=lambda m: click.echo(m, err=True))
    except BackfillError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"backfill {result.run_id} finished: {result.loaded.records} feature records loaded "
               f"({result.loaded.slots_written} Redis slots updated); features topic {result.features_topic}"
               + (f", samples topic {result.samples_topic}" if result.samples_topic else "")
               + (f"; trained {result.trained_samples} samples into {result.snapshot_dir}" if train else ""))
