"""How the trainer's ranks read torchrun's environment (no process group is started here)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpu_trainer.distributed import Ranks, SharedStoreAcrossAgents
from rtrec.cli.main import cli


def test_one_process_without_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert Ranks.from_env() is None


def _two_agents_sharing_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """What torchrun gives rank 0 of two agents by default (no server listens at MASTER_PORT here)."""
    for key, value in {"WORLD_SIZE": "2", "RANK": "0", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "1", "TORCHELASTIC_USE_AGENT_STORE": "True"}.items():
        monkeypatch.setenv(key, value)


def test_agents_sharing_the_rendezvous_store_are_refused_with_the_setting_that_fixes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Their ranks would start, then fail to meet again after the first restart (test_distributed.py runs
    two agents with the setting)."""
    _two_agents_sharing_the_store(monkeypatch)
    with pytest.raises(SharedStoreAcrossAgents, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        Ranks.from_env(timeout_s=1.0)


def test_train_run_ends_with_the_cause_and_no_traceback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _two_agents_sharing_the_store(monkeypatch)
    monkeypatch.setenv("RTREC_TRAINER__SNAPSHOT_DIR", str(tmp_path))
    result = CliRunner().invoke(cli, ["train", "run"])
    assert result.exit_code == 1, result.output
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in result.output and "Traceback" not in result.output
