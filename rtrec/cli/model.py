"""`rtrec model list|rollback|score|export-onnx`."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from core.settings import Settings
from feature_store.redis_store import RedisFeatureStore
from gpu_trainer.model_registry import ModelRegistry
from gpu_trainer.onnx_export import export_onnx
from gpu_trainer.scoring import Recent, load_current, load_snapshot, score, served_recent
from gpu_trainer.snapshots import SnapshotError


def _registry(settings: Settings) -> ModelRegistry:
    return ModelRegistry.from_settings(settings.trainer, settings.redis)


@click.group("model")
def model_group() -> None:
    """Model snapshots: list, roll back, score, export."""


@model_group.command("list")
@click.pass_obj
def list_snapshots(settings: Settings) -> None:
    """Every kept snapshot; `*` marks the current one."""
    click.echo(f"{'':2}{'version':>8} {'created (UTC)':20} {'samples':>10} {'auc':>7} {'logloss':>8} promoted")
    for r in _registry(settings).rows():
        created = datetime.fromtimestamp(r.created_at / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")
        auc = f"{r.auc:.4f}" if r.auc is not None else "-"
        loss = f"{r.logloss:.4f}" if r.logloss is not None else "-"
        click.echo(f"{'*' if r.current else '':2}{r.version:>8} {created:20} {r.samples_seen:>10} {auc:>7} "
                   f"{loss:>8} {'yes' if r.promoted else 'no'}")


@model_group.command("rollback")
@click.option("--to", "to_version", type=int, required=True)
@click.pass_obj
def rollback(settings: Settings, to_version: int) -> None:
    """Make snapshot V the current model (its files are verified first)."""
    try:
        previous = _registry(settings).rollback(to_version)
    except SnapshotError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"current model: v{to_version} (was v{previous})")


@model_group.command("score")
@click.option("--user", required=True)
@click.option("--items", required=True, help="Comma-separated item ids.")
@click.option("--recent", default=None, help="The user's newest engaged items, newest first, comma-separated, "
              "for a model trained with trainer.history_length > 0. Default: as the online store serves them.")
@click.option("--recent-types", default=None, help="With --recent: each item's event type (click, like, cart, "
              "order, ...), comma-separated, for the din model. Default: not known.")
@click.option("--recent-ages-ms", default=None, help="With --recent: how long ago each was engaged with (ms), "
              "comma-separated, for the din model. Default: not known.")
@click.pass_obj
def score_items(settings: Settings, user: str, items: str, recent: str | None, recent_types: str | None,
                recent_ages_ms: str | None) -> None:
    """Score items for a user with the current snapshot and the online features."""
    item_ids = [i.strip() for i in items.split(",") if i.strip()]
    if recent is None and (recent_types is not None or recent_ages_ms is not None):
        raise click.UsageError("--recent-types and --recent-ages-ms go with --recent")
    given = None if recent is None else _given_recent(recent, recent_types, recent_ages_ms)
    try:
        loaded = load_current(_registry(settings))
    except SnapshotError as exc:
        raise click.ClickException(str(exc)) from exc
    reader = RedisFeatureStore.from_settings(settings.redis, settings.flink)
    if given is None:
        given = served_recent(loaded, reader, user, settings.flink.history_lookback_s)
    scores = score(loaded, reader, user, item_ids, given)
    click.echo(f"model v{loaded.manifest.version}")
    if loaded.history_length:
        click.echo(f"recent items ({'given' if recent is not None else 'online store'}): {','.join(given.items)}")
    for item, s in sorted(zip(item_ids, scores, strict=True), key=lambda p: -p[1]):
        click.echo(f"{item}\t{s:.6f}")


def _given_recent(items: str, types: str | None, ages_ms: str | None) -> Recent:
    def split(text: str | None) -> list[str]:
        return [] if text is None else [v.strip() for v in text.split(",") if v.strip()]

    listed = split(items)
    for name, values in (("--recent-types", split(types)), ("--recent-ages-ms", split(ages_ms))):
        if values and len(values) != len(listed):
            raise click.UsageError(f"{name} needs one value per --recent item ({len(listed)}), got {len(values)}")
    try:
        return Recent(listed, split(types), [int(v) for v in split(ages_ms)])
    except ValueError:
        raise click.UsageError(f"--recent-ages-ms takes whole milliseconds, got {ages_ms!r}") from None


@model_group.command("export-onnx")
@click.option("--version", "version", type=int, default=None, help="Default: the current snapshot.")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True)
@click.pass_obj
def export(settings: Settings, version: int | None, output: Path) -> None:
    """Write the snapshot's model as ONNX (inputs user_idx, item_idx, dense; output probability)."""
    registry = _registry(settings)
    try:
        loaded = load_snapshot(registry.store, version) if version is not None else load_current(registry)
    except SnapshotError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"wrote {export_onnx(loaded, output)} from v{loaded.manifest.version}")
