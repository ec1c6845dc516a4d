"""Pick the device once (CUDA when present, else CPU), the autocast dtype that goes with it, and
PyTorch's thread count."""

from __future__ import annotations

import os

import torch


def pick_device(choice: str = "auto") -> torch.device:
    """`trainer.device`: auto (CUDA when present), cpu, cuda or cuda:N. A bare CUDA choice under
    torchrun is the rank's own GPU of the node's (LOCAL_RANK modulo the GPUs), made the current one,
    so ranks on one machine do not all train on the first GPU.

    >>> pick_device("cpu")
    device(type='cpu')
    """
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"trainer.device is {choice!r} but no CUDA device is available")
    device = torch.device(choice)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def amp_dtype(device: torch.device, choice: str = "auto") -> torch.dtype | None:
    """None means full precision. On CPU `auto` stays fp32 (CPU autocast is slower for these models)."""
    if choice == "off" or (choice == "auto" and device.type != "cuda"):
        return None
    if choice == "fp16":
        return torch.float16
    if choice in ("bf16", "auto"):
        return torch.bfloat16
    raise ValueError(f"trainer.amp must be auto, bf16, fp16 or off, not {choice!r}")


def set_torch_threads(choice: int | None = None) -> int:
    """`trainer.torch_threads`, or by default this process's share of the cores (torchrun's
    LOCAL_WORLD_SIZE ranks share the machine) less one; at least 1. Returns the count set.

    >>> set_torch_threads(1), torch.get_num_threads()
    (1, 1)
    """
    if choice is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        choice = max(1, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))) - 1)
    if torch.get_num_threads() != choice:
        torch.set_num_threads(choice)
    return choice
