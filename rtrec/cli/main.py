"""The one entry point: `rtrec <group> <command>`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import redis
from confluent_kafka import KafkaError, KafkaException

from core.kafka import KafkaAuthenticationError, KafkaAuthorizationError
from core.settings import Settings, load_settings
from rtrec.cli.backfill import backfill_command
from rtrec.cli.demo import demo_command
from rtrec.cli.evaluate import evaluate_command
from rtrec.cli.features import features_group
from rtrec.cli.model import model_group
from rtrec.cli.produce import produce_group
from rtrec.cli.services import services_group
from rtrec.cli.topics import consume_command
from rtrec.cli.train import train_group

_NOT_AUTHORIZED = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
                   KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED)


class RtrecGroup(click.Group):
    """Turns a refused Kafka or Redis login, or an operation Kafka's ACLs do not allow, into one line
    naming the server and the user (never the password), and a non-zero exit."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KafkaAuthorizationError as exc:
            raise click.ClickException(str(exc)) from exc
        except (KafkaException, redis.AuthenticationError) as exc:
            said = refusal(ctx.obj if isinstance(ctx.obj, Settings) else load_settings(), exc)
            if said is None:
                raise
            raise click.ClickException(said) from exc


def refusal(settings: Settings, exc: Exception) -> str | None:
    """One line for a refused login or an operation no ACL allows; None for any other error."""
    k, r = settings.kafka, settings.redis
    if isinstance(exc, redis.AuthenticationError):
        return (f"Redis at {r.redacted_url()} refused user {r.username or 'default'}: {exc} "
                "(check redis.username and redis.password / redis.password_file)")
    if isinstance(exc, KafkaAuthenticationError):
        return (f"Kafka at {k.bootstrap_servers} refused user {k.security.username or '(none)'} "
                f"({k.security.protocol} {k.security.sasl_mechanism}): {exc.args[0].str()} "
                "(check kafka.security.username and password / password_file)")
    error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
    if error is not None and error.code() in _NOT_AUTHORIZED:
        return (f"Kafka at {k.bootstrap_servers} did not authorize user {k.security.username or 'ANONYMOUS'}: "
                f"{error.str()} (an ACL is missing; `rtrec services acls --dry-run` lists those the pipeline needs)")
    return None


@click.group(cls=RtrecGroup)
@click.option("--config", "config_file", type=click.Path(path_type=Path, dir_okay=False), default=None,
              envvar="RTREC_CONFIG", help="TOML settings file (env vars RTREC_* override it).")
@click.pass_context
def cli(ctx: click.Context, config_file: Path | None) -> None:
    """Real-time recommender training pipeline."""
    ctx.obj = load_settings(config_file)


cli.add_command(services_group)
cli.add_command(produce_group)
cli.add_command(consume_command)
cli.add_command(demo_command)
cli.add_command(train_group)
cli.add_command(model_group)
cli.add_command(features_group)
cli.add_command(evaluate_command)
cli.add_command(backfill_command)
