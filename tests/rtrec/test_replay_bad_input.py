"""The bad-input corpus for replay (tests/data/bad/README.md): each file's outcome and message."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rtrec.cli.main import cli
from rtrec.sources.replay import ColumnMapping, read_log

BAD = Path(__file__).parents[1] / "data" / "bad"


@pytest.mark.parametrize(("name", "message"), [
    ("missing_column.csv", "no column 'timestamp' (--time-col); its columns are ['user_id', 'item_id', 'time',"),
    ("empty.csv", "the file is empty (no header, no data rows)"),
    ("header_only.csv", "no data rows (the file is empty or holds a header only)"),
    ("garbage.parquet", "is not a readable Parquet file"),
    ("dates_before_1980.csv", "2 events fall outside the accepted event-time range [1980-01-01T00:00:00.000Z, "),
])
def test_a_file_that_cannot_be_replayed_is_refused_before_anything_is_produced(name: str, message: str) -> None:
    # the broker address is a closed port: refusing must not need it, and nothing may be sent
    result = CliRunner().invoke(cli, ["produce", "replay", str(BAD / name)],
                                env={"RTREC_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9"})
    assert result.exit_code == 1, result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: ") and message in last and name in last, last
    if name == "dates_before_1980.csv":
        assert "RTREC_FLINK__MIN_EVENT_TIME_MS" in last
        assert "dates_before_1980.csv:2 at 1975-03-01T00:00:00.000Z" in last
    assert result.stdout == ""  # no "read N rows, produced M events" summary: nothing ran


def test_typed_parquet_ids_must_be_strings_or_integers() -> None:
    events, rejected, n_rows = read_log(BAD / "wrong_types.parquet", ColumnMapping(type=None, position="position"))
    assert n_rows == 4
    assert {r.line: r.reason for r in rejected} == {
        1: "user_id 1.5 is not an id: ids are strings or integers",
        2: "item_id ['7'] is not an id: ids are strings or integers",
        3: "item_id ['8'] is not an id: ids are strings or integers",
        4: "item_id ['9'] is not an id: ids are strings or integers",
    }
    assert events == []


def test_a_nullable_integer_id_column_reads_as_integers() -> None:
    events, rejected, _ = read_log(BAD / "nullable_int_ids.parquet", ColumnMapping(type=None))
    assert [(e["user_id"], e["item_id"]) for e in events] == [("u1", "7"), ("u3", "8")]
    assert [(r.line, r.reason) for r in rejected] == [(2, "missing item_id")]


def test_bom_and_crlf_are_accepted() -> None:
    events, rejected, n_rows = read_log(BAD / "bom_crlf.csv", ColumnMapping())
    assert (n_rows, rejected) == (2, [])
    assert [(e["user_id"], e["item_id"], e["event_type"]) for e in events] == [("u1", "i1", "impression"),
                                                                                ("u1", "i1", "click")]
