"""`rtrec train run`."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click
from pydantic import ValidationError

from core.settings import Settings, TrainerSettings
from gpu_trainer.distributed import SharedStoreAcrossAgents
from gpu_trainer.service import RanksChanged, TrainerService
from rtrec.cli.signals import graceful_stop

RANKS_CHANGED_EXIT = 75  # EX_TEMPFAIL: torchrun restarts the rank (--max-restarts) in the new membership


@click.group("train")
def train_group() -> None:
    """The incremental trainer service."""


@train_group.command("run")
@click.option("--max-samples", type=int, default=None, help="Stop after this many samples in total.")
@click.option("--idle-exit", "idle_exit_s", type=float, default=None, help="Stop after N seconds without input.")
@click.option("--model", type=click.Choice(["mf", "deepfm", "din"]), default=None, help="Overrides trainer.model.")
@click.pass_obj
def run(settings: Settings, max_samples: int | None, idle_exit_s: float | None, model: str | None) -> None:
    """Consume training samples, train incrementally, publish snapshots. SIGTERM or Ctrl-C: a final
    snapshot, then exit 0 (within trainer.shutdown_timeout_s; a second signal exits at once).

    Under torchrun (`torchrun --nproc-per-node N -m rtrec train run`) each of the N ranks consumes its
    share of the partitions and rank 0 writes the snapshots of the one model (gpu_trainer.distributed)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if model:
        try:  # validated again: din needs trainer.history_length
            trainer = TrainerSettings.model_validate({**settings.trainer.model_dump(), "model": model})
        except ValidationError as exc:
            raise click.UsageError(str(exc.errors()[0]["msg"])) from None
        settings = settings.model_copy(update={"trainer": trainer})
    with graceful_stop(settings.trainer.shutdown_timeout_s) as stop:
        try:
            service = TrainerService.from_settings(settings)
        except SharedStoreAcrossAgents as exc:
            raise click.ClickException(str(exc)) from None
        try:
            summary = service.run(max_samples=max_samples, idle_exit_s=idle_exit_s, should_stop=stop.is_set)
        except RanksChanged as exc:
            click.echo(str(exc), err=True)
            sys.exit(RANKS_CHANGED_EXIT)
        finally:
            if service.ranks is not None:
                service.ranks.close()
    # One write: ranks share torchrun's output, and another rank's line could land between two.
    rank = "" if service.ranks is None else f"rank {service.ranks.rank} of {service.ranks.world}: "
    click.echo(f"{rank}trained {summary.samples_trained} samples, dead-lettered {summary.dead_lettered}, "
               f"snapshots {summary.snapshots}, promoted {summary.promoted}, "
               + ("started fresh" if summary.resumed_from is None else f"resumed from v{summary.resumed_from}"))


@train_group.command("autoscale")
@click.option("--interval", "interval_s", type=float, default=10.0, show_default=True,
              help="Seconds between two readings of the lag.")
@click.option("--metrics-port", type=int, default=0, help="Serve the lag and rank gauges for Prometheus here.")
@click.option("--log-file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Where the ranks write (default: <services.state_dir>/trainer-ranks.log).")
@click.pass_obj
def autoscale(settings: Settings, interval_s: float, metrics_port: int, log_file: Path | None) -> None:
    """Run the trainer as torchrun ranks, as many as the samples lag calls for (trainer.autoscale: one
    per lag_per_worker records, min_workers to max_workers, never more than the partitions; cooldowns).
    SIGTERM or Ctrl-C stops the ranks (a final snapshot) and then itself."""
    from gpu_trainer.scaling import ScalingPolicy
    from rtrec.autoscale import Autoscaler, TrainerRanks

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    log_file = log_file or settings.services.state_dir / "trainer-ranks.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    ranks = TrainerRanks({}, log_file, stop_timeout_s=settings.trainer.shutdown_timeout_s + 30)
    scaler = Autoscaler(settings, ranks, ScalingPolicy(settings.trainer.autoscale))
    if metrics_port:
        scaler.serve(metrics_port)
    click.echo(f"autoscaling the trainer ranks (log: {log_file}); Ctrl-C stops them")
    try:
        with graceful_stop(settings.trainer.shutdown_timeout_s + 60) as stop:
            scaler.run(interval_s, stop.is_set)
    finally:
        code = ranks.stop()
    click.echo(f"stopped the trainer ranks (exit code {code})")
