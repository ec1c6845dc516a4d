"""Pure nn.Modules scoring (user bucket, item bucket, dense features, and the user's recent items'
buckets, type buckets and age buckets) -> logit (`Batch.model_inputs` is that order)."""

from __future__ import annotations

from typing import Any

from torch import nn

from gpu_trainer.models.deepfm import DeepFM
from gpu_trainer.models.din import DIN
from gpu_trainer.models.mf import IncrementalMF

MODELS: dict[str, type[nn.Module]] = {"mf": IncrementalMF, "deepfm": DeepFM, "din": DIN}


def build_model(name: str, config: dict[str, Any]) -> nn.Module:
    try:
        return MODELS[name](**config)
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {sorted(MODELS)}") from None


def sparse_tables(model: nn.Module) -> dict[str, nn.Embedding]:
    """Embedding tables by the name of their weight parameter (row-sparse updates apply to these)."""
    return {f"{name}.weight": m for name, m in model.named_modules() if isinstance(m, nn.Embedding)}
