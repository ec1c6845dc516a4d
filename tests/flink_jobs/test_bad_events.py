"""The bad-input corpus for the feature job (tests/data/bad/events.jsonl) through its JVM decoder:
every case ends as the dead letter it names (with its reason) or is accepted; none raises."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from core.settings import Settings
from feature_store.keys import pair_id
from flink_jobs.environment import table_environment
from flink_jobs.feature_job import decode_args
from schemas.serde import serializer
from tests.flink_jobs.harness import T, create_topics, event, job_settings, produce, running_job, wait_for

pytestmark = pytest.mark.integration
CORPUS = Path(__file__).parents[1] / "data" / "bad" / "events.jsonl"
GOOD = {"event_id": "e1", "user_id": "u1", "item_id": "i1", "event_type": "click", "event_time": 1_700_000_000_000,
        "dwell_ms": None, "position": None, "session_id": None}


def _field(value: Any) -> Any:
    if isinstance(value, dict) and "repeat" in value:
        return value["repeat"] * value["times"]
    if isinstance(value, dict) and "from_now_ms" in value:
        return int(time.time() * 1000) + value["from_now_ms"]
    return value


def value_and_header(case: dict[str, Any]) -> tuple[bytes, bytes | None]:
    encode = serializer("InteractionEvent")
    if "value_hex" in case:
        value = bytes.fromhex(case["value_hex"]) + os.urandom(case.get("pad_random", 0))
    else:
        value = encode({**GOOD, **{k: _field(v) for k, v in case["event"].items()}})
        value = value[: len(value) - case.get("truncate", 0)] + bytes.fromhex(case.get("append_hex", ""))
    header = case.get("header", encode.headers[0][1].decode())
    return value, None if header is None else header.encode()


def sql_bytes(data: bytes) -> str:
    return f"CAST(X'{data.hex()}' AS BYTES)"


def test_every_bad_event_is_a_dead_letter_with_its_reason(settings: Settings) -> None:
    cases = [json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()]
    t_env = table_environment(settings.model_copy(update={"flink": settings.flink.model_copy(
        update={"checkpoint_interval_ms": 0})}))
    t_env.create_java_temporary_system_function("DECODE", "dev.rtrec.flink.DecodeInteractionEvent")
    args = decode_args(settings)
    selects = []
    for i, case in enumerate(cases):
        value, header = value_and_header(case)
        headers = f"MAP['rtrec-schema', {sql_bytes(header)}]" if header else "CAST(NULL AS MAP<STRING, BYTES>)"
        selects.append(f"SELECT {i} AS k, DECODE({sql_bytes(value)}, {headers}, {args}).error AS error")
    with t_env.execute_sql("\nUNION ALL\n".join(selects)).collect() as results:
        errors = {int(r[0]): r[1] for r in results}
    assert len(errors) == len(cases)
    for i, case in enumerate(cases):
        if case["expect"] == "accepted":
            assert errors[i] is None, (case["case"], errors[i])
        else:
            expected = case["expect"].removeprefix("dead letter: ")
            assert errors[i] is not None and expected in errors[i], (case["case"], errors[i])


def test_pair_ids_from_the_job_are_unambiguous_and_match_the_readers(settings: Settings) -> None:
    """Ids holding the separator or the escape: the job's pair records carry the readers' keys, one per pair."""
    pairs = [("uA|iB", "C"), ("uA", "iB|C"), ("u\\", "|i"), ("u", "\\|i"), ("u1", "i9")]
    s = job_settings(settings)
    create_topics(s)
    with running_job(s, with_samples=False):
        produce(s, [event(f"e{n}", "click", u, i, 100) for n, (u, i) in enumerate(pairs)]
                + [event("flush", "impression", "u9", "i9", 9000)])
        got = wait_for(s, s.kafka.topics.features, "FeatureRecord", lambda got: len(
            [r for r in got.records if r["entity_type"] == "user_item" and r["window_end"] == T + 3000]) >= len(pairs))
    from_job = {r["entity_id"] for r in got.records if r["entity_type"] == "user_item" and r["window_end"] == T + 3000}
    assert from_job == {pair_id(u, i) for u, i in pairs}
    assert len(from_job) == len(pairs)
