"""`rtrec produce synthetic|replay`."""

from __future__ import annotations

from pathlib import Path

import click

from core.settings import Settings
from rtrec.cli.signals import graceful_stop
from rtrec.sources.produce import produce_replay, produce_synthetic
from rtrec.sources.replay import ColumnMapping, ReplayError


@click.group("produce")
def produce_group() -> None:
    """Write interaction events into the events topic."""


@produce_group.command("synthetic")
@click.option("-n", "--events", type=int, default=10_000, show_default=True, help="How many; 0 runs endlessly.")
@click.option("--rate", type=float, default=None, help="Target events/s (default: as fast as possible).")
@click.option("--seed", type=int, default=None, help="Overrides synthetic.seed.")
@click.option("--start-ms", type=int, default=None, help="Event time of the first event (default: now).")
@click.option("--live", is_flag=True, help="Send each event when its event time comes (event time = wall clock); "
                                            "--rate then sets impressions per second, clicks come on top.")
@click.pass_obj
def synthetic(settings: Settings, events: int, rate: float | None, seed: int | None, start_ms: int | None,
              live: bool) -> None:
    """Seeded synthetic events: Zipf items, drifting user tastes, delayed clicks and likes. For a
    running pipeline use --live: paced by --rate alone, event time drifts away from the wall clock
    (and, far enough ahead, events are dead-lettered as being from the future)."""
    if live and start_ms is not None:
        raise click.UsageError("--live sends events at their event time: it starts now, not at --start-ms")
    update: dict[str, float] = {} if seed is None else {"seed": seed}
    if live and rate:
        update["events_per_second_event_time"] = rate
    settings = settings.model_copy(update={"synthetic": settings.synthetic.model_copy(update=update)})
    with graceful_stop(30.0) as stop:  # SIGTERM or Ctrl-C: what was sent is delivered, then exit 0
        summary = produce_synthetic(settings, events or None, rate, start_ms, live=live, should_stop=stop.is_set)
    click.echo(f"produced {summary.produced} events to {settings.kafka.topics.events} "
               f"in {summary.seconds:.1f}s ({summary.rate:,.0f} ev/s)")


def _type_map(text: str) -> dict[str, str]:
    pairs = [p.split("=", 1) for p in text.split(",") if p]
    if any(len(p) != 2 for p in pairs):
        raise click.BadParameter("use RAW=TYPE pairs separated by commas, e.g. clicks=click,carts=cart")
    return {k.strip().lower(): v.strip() for k, v in pairs}


@produce_group.command("replay")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--user-col", default="user_id", show_default=True, help="Column(s), '+'-joined, naming the user.")
@click.option("--item-col", default="item_id", show_default=True)
@click.option("--time-col", default="timestamp", show_default=True, help="Epoch s/ms/us or ISO-8601 with zone.")
@click.option("--type-col", default="event_type", show_default=True, help="Absent column: --default-type.")
@click.option("--default-type", default="impression", show_default=True)
@click.option("--type-map", default="", help="RAW=TYPE pairs, e.g. clicks=click,carts=cart.")
@click.option("--click-col", default=None, help="0/1 column: each row is an impression, clicked when 1.")
@click.option("--dwell-col", default=None)
@click.option("--position-col", default=None)
@click.option("--session-col", default=None)
@click.option("--event-id-col", default=None, help="Default: FILE:LINE, so a replay is idempotent.")
@click.option("--speedup", type=float, default=None, help="Replay at N x event time (default: as fast as possible).")
@click.option("--items-by-file", is_flag=True, help="Prefix item ids with their file's stem (ids unique per file).")
@click.pass_obj
def replay(settings: Settings, paths: tuple[Path, ...], user_col: str, item_col: str, time_col: str, type_col: str,
           default_type: str, type_map: str, click_col: str | None, dwell_col: str | None,
           position_col: str | None, session_col: str | None, event_id_col: str | None,
           speedup: float | None, items_by_file: bool) -> None:
    """Replay CSV or Parquet interaction logs, merged in event-time order."""
    mapping = ColumnMapping(user=user_col, item=item_col, time=time_col, type=type_col, default_type=default_type,
                            type_map=_type_map(type_map), click=click_col, dwell=dwell_col,
                            position=position_col, session=session_col, event_id=event_id_col)
    try:
        summary = produce_replay(settings, paths, mapping, speedup, report=lambda s: click.echo(s, err=True),
                                 items_by_file=items_by_file)
    except ReplayError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"read {summary.read} rows, produced {summary.produced} events, rejected {summary.rejected} rows "
               f"(to {settings.kafka.topics.dead_letter}) in {summary.seconds:.1f}s")
