"""`rtrec consume`: read a topic back, decoded, to see what flows."""

from __future__ import annotations

import json
import uuid

import click

from core.settings import Settings
from schemas.kafka_io import AvroConsumer, consume_until

SCHEMA_BY_TOPIC_FIELD = {"events": "InteractionEvent", "features": "FeatureRecord", "samples": "TrainingSample",
                         "snapshots": "ModelSnapshot", "dead_letter": "DeadLetter"}


@click.command("consume")
@click.argument("topic", type=click.Choice(sorted(SCHEMA_BY_TOPIC_FIELD)))
@click.option("-n", "--max-records", type=int, default=10, show_default=True)
@click.option("--timeout", type=float, default=10.0, show_default=True)
@click.pass_obj
def consume_command(settings: Settings, topic: str, max_records: int, timeout: float) -> None:
    """Print records of one pipeline topic from its beginning (JSON lines)."""
    name = getattr(settings.kafka.topics, topic)
    consumer = AvroConsumer(settings.kafka.bootstrap_servers, f"rtrec-cli-{uuid.uuid4().hex[:8]}", [name],
                            SCHEMA_BY_TOPIC_FIELD[topic], **settings.kafka.security.librdkafka())
    try:
        batch = consume_until(consumer, max_records, timeout)
    finally:
        consumer.close()
    for record in batch.records[:max_records]:
        click.echo(json.dumps(record, default=lambda b: b.hex() if isinstance(b, bytes) else str(b)))
    for r in batch.rejected:
        click.echo(f"undecodable {r.topic}[{r.partition}]@{r.offset}: {r.reason}", err=True)
