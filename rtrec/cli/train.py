"""`rtrec train run`."""

from __future__ import annotations

import logging

import click

from core.settings import Settings
from gpu_trainer.service import TrainerService
from rtrec.cli.signals import graceful_stop


@click.group("train")
def train_group() -> None:
    """The incremental trainer service."""


@train_group.command("run")
@click.option("--max-samples", type=int, default=None, help="Stop after this many samples in total.")
@click.option("--idle-exit", "idle_exit_s", type=float, default=None, help="Stop after N seconds without input.")
@click.option("--model", type=click.Choice(["mf", "deepfm"]), default=None, help="Overrides trainer.model.")
@click.pass_obj
def run(settings: Settings, max_samples: int | None, idle_exit_s: float | None, model: str | None) -> None:
    """Consume training samples, train incrementally, publish snapshots. SIGTERM or Ctrl-C: a final
    snapshot, then exit 0 (within trainer.shutdown_timeout_s; a second signal exits at once).

    Under torchrun (`torchrun --nproc-per-node N -m rtrec train run`) each of the N ranks consumes its
    share of the partitions and rank 0 writes the snapshots of the one model (gpu_trainer.distributed)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if model:
        settings = settings.model_copy(update={"trainer": settings.trainer.model_copy(update={"model": model})})
    with graceful_stop(settings.trainer.shutdown_timeout_s) as stop:
        service = TrainerService.from_settings(settings)
        try:
            summary = service.run(max_samples=max_samples, idle_exit_s=idle_exit_s, should_stop=stop.is_set)
        finally:
            if service.ranks is not None:
                service.ranks.close()
    if service.ranks is not None:
        click.echo(f"rank {service.ranks.rank} of {service.ranks.world}: ", nl=False)
    click.echo(f"trained {summary.samples_trained} samples, dead-lettered {summary.dead_lettered}, "
               f"snapshots {summary.snapshots}, promoted {summary.promoted}, "
               + ("started fresh" if summary.resumed_from is None else f"resumed from v{summary.resumed_from}"))
