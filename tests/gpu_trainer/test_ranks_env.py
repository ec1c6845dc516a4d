"""How the trainer's ranks read torchrun's environment (no process group is started here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from gpu_trainer.device import pick_device
from gpu_trainer.distributed import Ranks, SharedStoreAcrossAgents, process_group_backend
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


def test_ranks_on_a_gpu_machine_each_take_their_own_gpu_and_nccl_for_cuda_tensors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: torch's CUDA queries are stood in for; what is checked is the choice made from them."""
    chosen: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert pick_device("auto") == torch.device("cuda", 1) == chosen[-1]  # the 6th rank of the node: GPU 5 mod 4
    assert pick_device("cuda:3") == torch.device("cuda", 3)  # a GPU named in the settings is taken as named
    assert process_group_backend(torch.device("cuda", 1)) == "cpu:gloo,cuda:nccl"
    assert process_group_backend(pick_device("cpu")) == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        pick_device("cuda")
