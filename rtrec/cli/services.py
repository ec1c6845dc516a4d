"""`rtrec services up|down|status`."""

from __future__ import annotations

import time

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
@click.option("--secure", is_flag=True,
              help="Kafka on SASL_SSL with SCRAM users and ACLs, Redis on TLS with an ACL user "
                   "(services.secure.enabled); prints the settings file its clients need.")
@click.pass_obj
def up(settings: Settings, names: tuple[str, ...], secure: bool) -> None:
    """Start the services (all, or those named) and wait until they answer."""
    cfg = settings.services
    if secure:
        cfg = cfg.model_copy(update={"secure": cfg.secure.model_copy(update={"enabled": True})})
    try:
        _print(manager.up(cfg, list(names) or None))
    except ServiceError as exc:
        raise click.ClickException(str(exc)) from exc
    client_file = manager.client_settings_file(cfg)
    if client_file:
        click.echo(f"clients: export RTREC_CONFIG={client_file}  (passwords stay in files beside it)")


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


@services_group.command("acls")
@click.option("--user", default=None, help="The pipeline's Kafka user (default: services.secure.user).")
@click.option("--dry-run", is_flag=True, help="Only print the ACLs.")
@click.option("--wait", "wait_s", type=float, default=0.0, show_default=True,
              help="Keep trying this long while the broker is not ready (a container starting beside it).")
@click.pass_obj
def acls(settings: Settings, user: str | None, dry_run: bool, wait_s: float) -> None:
    """Grant the pipeline's ACLs on the Kafka of `kafka.bootstrap_servers`, connecting as the principal of
    `kafka.security` (an admin): read, write, create, delete and describe the topics starting
    services.secure.topic_prefix; the groups and transactional ids starting services.secure.id_prefix."""
    from rtrec.services.kafka_broker import grant_pipeline_acls, pipeline_acls

    cfg = settings.services
    if user:
        cfg = cfg.model_copy(update={"secure": cfg.secure.model_copy(update={"user": user})})
    for b in pipeline_acls(cfg):
        click.echo(f"allow {b.principal} {b.operation.name} on {b.restype.name} "
                   f"{b.resource_pattern_type.name.lower()} '{b.name}'")
    if not dry_run:
        k = settings.kafka
        deadline = time.monotonic() + wait_s
        while True:
            try:
                grant_pipeline_acls(k.bootstrap_servers, k.security.librdkafka(), cfg)
                break
            except ServiceError as exc:
                if time.monotonic() >= deadline:
                    raise click.ClickException(str(exc)) from exc
                click.echo(f"not yet ({exc}); trying again", err=True)
                time.sleep(3)
        click.echo(f"granted to User:{cfg.secure.user} on {k.bootstrap_servers}")
