"""Pick the device once (CUDA when present, else CPU) and the autocast dtype that goes with it."""

from __future__ import annotations

import torch


def pick_device(choice: str = "auto") -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("trainer.device is 'cuda' but no CUDA device is available")
    return torch.device(choice)


def amp_dtype(device: torch.device, choice: str = "auto") -> torch.dtype | None:
    """None means full precision. On CPU `auto` stays fp32 (CPU autocast is slower for these models)."""
    if choice == "off" or (choice == "auto" and device.type != "cuda"):
        return None
    if choice == "fp16":
        return torch.float16
    if choice in ("bf16", "auto"):
        return torch.bfloat16
    raise ValueError(f"trainer.amp must be auto, bf16, fp16 or off, not {choice!r}")
