"""Avro encode/decode rates, and produce/consume rates against a real local broker.

Run: `.venv/bin/python -m benchmarks.bench_wire [--events N]`. Starts the local services when
`--bootstrap` is not given (on free ports, stopped afterwards).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from benchmarks.common import emit
from core.kafka import ensure_topics, producer_config
from core.settings import SyntheticSettings
from rtrec.sources.synthetic import generate
from schemas.kafka_io import AvroProducer, read_topic
from schemas.serde import deserializer, serializer


@contextlib.contextmanager
def broker(bootstrap: str | None) -> Iterator[str]:
    if bootstrap:
        yield bootstrap
        return
    from tests.infra import local_processes

    with tempfile.TemporaryDirectory() as tmp, local_processes(Path(tmp)) as endpoints:
        yield endpoints.kafka_bootstrap


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--bootstrap", default=None, help="Use this broker instead of starting one.")
    args = parser.parse_args()
    n = args.events
    print(f"generating {n} synthetic events", file=sys.stderr)
    events = generate(SyntheticSettings(), start_ms=1_700_000_000_000, n=n)

    enc, dec = serializer("InteractionEvent"), deserializer("InteractionEvent")
    began = time.perf_counter()
    values = enc.encode_many(events)
    emit("wire", "avro_encode", n / (time.perf_counter() - began), "events/s", n)
    headers = [enc.header_value] * n
    began = time.perf_counter()
    decoded, errors = dec.decode_many(values, headers)
    emit("wire", "avro_decode", n / (time.perf_counter() - began), "events/s", n)
    assert len(decoded) == n and not errors

    with broker(args.bootstrap) as bootstrap:
        topic = f"bench.wire.{uuid.uuid4().hex[:8]}"
        ensure_topics(bootstrap, [topic], partitions=2)
        producer = AvroProducer(producer_config(bootstrap), topic, "InteractionEvent")
        began = time.perf_counter()
        producer.produce_many(events, key=lambda e: e["user_id"])
        producer.flush()
        emit("wire", "kafka_produce_avro", n / (time.perf_counter() - began), "events/s", n)
        began = time.perf_counter()
        got = read_topic(bootstrap, topic, "InteractionEvent", timeout_s=120)
        emit("wire", "kafka_consume_avro", len(got.records) / (time.perf_counter() - began), "events/s",
             len(got.records))
        assert len(got.records) == n


if __name__ == "__main__":
    main()
