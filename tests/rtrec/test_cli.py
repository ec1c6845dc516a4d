"""The CLI against the real services."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from core.settings import Settings
from rtrec.cli.main import cli

pytestmark = pytest.mark.integration


def _env(settings: Settings) -> dict[str, str]:
    return {"RTREC_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
            "RTREC_KAFKA__TOPICS__EVENTS": settings.kafka.topics.events,
            "RTREC_KAFKA__TOPICS__DEAD_LETTER": settings.kafka.topics.dead_letter}


def test_produce_synthetic_then_consume(settings: Settings) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["produce", "synthetic", "-n", "300", "--seed", "3", "--start-ms", "1700000000000"],
                           env=_env(settings))
    assert result.exit_code == 0, result.output
    assert "produced 300 events" in result.output
    result = runner.invoke(cli, ["consume", "events", "-n", "300"], env=_env(settings))
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert len(records) == 300 and {r["event_id"].split("-")[0] for r in records} == {"syn3"}


def test_replay_reports_rejects(settings: Settings) -> None:
    result = CliRunner().invoke(cli, ["produce", "replay", "tests/data/malformed_events.csv"], env=_env(settings))
    assert result.exit_code == 0, result.output
    assert "read 10 rows, produced 4 events, rejected 6 rows" in result.output
    assert "malformed_events.csv:6: rejected: unknown event type 'teleport'" in result.output


def test_live_synthetic_events_carry_the_wall_clock(settings: Settings) -> None:
    import time

    began = int(time.time() * 1000)
    result = CliRunner().invoke(cli, ["produce", "synthetic", "-n", "400", "--live", "--rate", "400"],
                                env=_env(settings))
    ended = int(time.time() * 1000)
    assert result.exit_code == 0, result.output
    assert 0.7 < (ended - began) / 1000 < 5  # 400 events at 400 impressions/s plus clicks: about a second
    records = CliRunner().invoke(cli, ["consume", "events", "-n", "400"], env=_env(settings)).stdout.splitlines()
    times = [json.loads(line)["event_time"] for line in records if line.startswith("{")]
    assert len(times) == 400 and began <= min(times) and max(times) <= ended + 100
