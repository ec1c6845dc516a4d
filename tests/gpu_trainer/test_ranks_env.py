"""How the trainer's ranks read torchrun's environment (no process group is started here)."""

from __future__ import annotations

import pytest

from gpu_trainer.distributed import Ranks


def test_one_process_without_torchrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert Ranks.from_env() is None


def test_agents_sharing_the_rendezvous_store_are_refused_with_the_setting_that_fixes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Their ranks would start, then fail to meet again after the first restart (test_distributed.py runs
    two agents with the setting)."""
    for key, value in {"WORLD_SIZE": "2", "RANK": "0", "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "1", "TORCHELASTIC_USE_AGENT_STORE": "True"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RuntimeError, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        Ranks.from_env(timeout_s=1.0)
