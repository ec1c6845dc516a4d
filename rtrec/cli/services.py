"""`rtrec services up|down|status`."""

from __future__ import annotations

import click

from core.settings import Settings
from rtrec.services import manager
from rtrec.services.process import ServiceError


def _print(results: dict[str, str]) -> None:
    for name, text in results.items():
        click.echo(f"{name:6s} {text}")


@click.group("services")
def services_group() -> None:
    """Local Kafka (KRaft) and Redis on 127.0.0.1."""


@services_group.command("up")
@click.argument("names", nargs=-1)
@click.pass_obj
def up(settings: Settings, names: tuple[str, ...]) -> None:
    """Start the services (all, or those named) and wait until they answer."""
    try:
        _print(manager.up(settings.services, list(names) or None))
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from exc


@services_group.command("down")
@click.argument("names", nargs=-1)
@click.pass_obj
def down(settings: Settings, names: tuple[str, ...]) -> None:
    """Stop the services started by `up`."""
    _print(manager.down(settings.services, list(names) or None))


@services_group.command("status")
@click.pass_obj
def status(settings: Settings) -> None:
    """Show whether each service runs and answers."""
    _print(manager.status(settings.services))
