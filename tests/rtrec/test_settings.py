from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from core.settings import Settings, load_settings


def test_defaults() -> None:
    s = Settings()
    assert s.kafka.bootstrap_servers == "127.0.0.1:19092"
    assert s.redis.url.endswith(":16379/0")


def test_file_then_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "rtrec.toml"
    cfg.write_text('[kafka]\nbootstrap_servers = "k:1"\n[kafka.topics]\nevents = "ev"\n[redis]\nttl_s = 5\n')
    s = load_settings(cfg)
    assert (s.kafka.bootstrap_servers, s.kafka.topics.events, s.redis.ttl_s) == ("k:1", "ev", 5)
    monkeypatch.setenv("RTREC_REDIS__TTL_S", "9")
    assert load_settings(cfg).redis.ttl_s == 9


def test_unknown_keys_and_mutation_are_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("[redis]\nttl = 5\n")
    with pytest.raises(ValidationError):
        load_settings(cfg)
    with pytest.raises(ValidationError):
        Settings().redis.ttl_s = 3  # type: ignore[misc]
    with pytest.raises(FileNotFoundError):
        load_settings(tmp_path / "missing.toml")


def test_a_state_ttl_shorter_than_the_lookback_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RTREC_FLINK__HISTORY_LOOKBACK_S", "600")
    monkeypatch.setenv("RTREC_FLINK__STATE_TTL_S", "300")
    with pytest.raises(ValidationError, match="state_ttl_s .300. is shorter than flink.history_lookback_s"):
        load_settings(None)
    monkeypatch.setenv("RTREC_FLINK__STATE_TTL_S", "0")  # never forget: allowed
    assert load_settings(None).flink.state_ttl_s == 0
