"""`rtrec evaluate --data FILE`."""

from __future__ import annotations

from pathlib import Path

import click

from core.settings import Settings
from rtrec.cli.produce import _type_map
from rtrec.sources.replay import ColumnMapping, ReplayError


@click.command("evaluate")
@click.option("--data", "paths", type=click.Path(path_type=Path, exists=True, dir_okay=False),
              multiple=True, help="A log file; repeat to merge several in event-time order.")
@click.option("--synthetic-events", type=int, default=None,
              help="Instead of --data: this many events of the synthetic generator (drifting tastes).")
@click.option("--synthetic-hours", type=float, default=6.0, show_default=True,
              help="The event time the synthetic events span.")
@click.option("--items-by-file", is_flag=True, help="Prefix item ids with their file's stem (ids unique per file).")
@click.option("--user-col", default="user_id", show_default=True)
@click.option("--item-col", default="item_id", show_default=True)
@click.option("--time-col", default="timestamp", show_default=True)
@click.option("--type-col", default="event_type", show_default=True)
@click.option("--type-map", default="")
@click.option("--click-col", default=None)
@click.option("--position-col", default=None)
@click.option("--train-fraction", type=float, default=0.3, show_default=True, help="The frozen model's share.")
@click.option("--period-hours", type=float, default=24.0, show_default=True, help="Periodic retraining interval.")
@click.option("--ewc-lambda", "ewc_lambdas", type=float, multiple=True,
              help="EWC strength to compare; repeat for several (default: trainer.ewc_lambda).")
@click.option("--peer", type=click.Choice(["river"]), default=None,
              help="A peer library's learner on the same samples (River's FMClassifier; `pip install river`).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path, file_okay=False), default=Path("eval-out"),
              show_default=True)
@click.pass_obj
def evaluate_command(settings: Settings, paths: tuple[Path, ...], synthetic_events: int | None,
                     synthetic_hours: float, items_by_file: bool, user_col: str, item_col: str,
                     time_col: str, type_col: str, type_map: str, click_col: str | None, position_col: str | None,
                     train_fraction: float, period_hours: float, ewc_lambdas: tuple[float, ...],
                     peer: str | None, out_dir: Path) -> None:
    """Replay logs through the pipeline and compare frozen, periodic and real-time training."""
    from rtrec.evaluation import compare, pipeline_samples, synthetic_samples, write_report
    from rtrec.services import manager

    if bool(paths) == (synthetic_events is not None):
        raise click.UsageError("give either --data (once or more) or --synthetic-events")
    if peer == "river":
        import importlib.util

        if importlib.util.find_spec("river") is None:
            raise click.UsageError("--peer river needs River: pip install river (the project's `peer` extra)")

    manager.up(settings.services)
    mapping = ColumnMapping(user=user_col, item=item_col, time=time_col, type=type_col, type_map=_type_map(type_map),
                            click=click_col, position=position_col)
    def say(message: str) -> None:
        click.echo(message, err=True)

    if synthetic_events is not None:
        samples = synthetic_samples(settings, synthetic_events, synthetic_hours, say)
    else:
        try:
            samples = pipeline_samples(settings, paths, mapping, say, items_by_file=items_by_file)
        except ReplayError as exc:
            raise click.ClickException(str(exc)) from exc
    if len(samples) < 100:
        raise click.ClickException(f"only {len(samples)} samples: too few to compare strategies")
    cfg = settings.trainer.model_copy(update={"user_buckets": 1 << 16, "item_buckets": 1 << 14})
    results = compare(samples, cfg, train_fraction, period_hours * 3600, ewc_lambdas=ewc_lambdas, peer=peer,
                      say=say, history_length=settings.flink.history_length)
    table, plot = write_report(results, out_dir)
    click.echo(table)
    click.echo(f"plot: {plot}")
