"""Export of a snapshot's published model to ONNX (inputs: user bucket, item bucket, dense features,
and for a model that reads them the recent items' buckets, [batch, history_length], -1 padding; for
the din model also their type and age buckets, `gpu_trainer.batch.type_buckets` and `age_buckets`).

Callers hash ids into buckets with `gpu_trainer.batch.bucket` and the snapshot's bucket counts.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from gpu_trainer.scoring import LoadedModel


class _Probability(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.model(*inputs))


def export_onnx(loaded: LoadedModel, path: Path) -> Path:
    n_dense = int(loaded.manifest.model_config["n_dense"])
    example: tuple[torch.Tensor, ...] = (torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64),
                                         torch.zeros(2, n_dense))
    names = ["user_idx", "item_idx", "dense"]
    if loaded.history_length:
        example = (*example, torch.full((2, loaded.history_length), -1, dtype=torch.int64))
        names.append("history_idx")
        if loaded.reads_types_and_ages:
            example = (*example, *(torch.zeros(2, loaded.history_length, dtype=torch.int64) for _ in range(2)))
            names += ["history_type", "history_age"]
    wrapper = _Probability(loaded.model).eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter needs no onnxscript
        torch.onnx.export(wrapper, example, str(path), dynamo=False, input_names=names,
                          output_names=["probability"], opset_version=17,
                          dynamic_axes={**{name: {0: "batch"} for name in names}, "probability": {0: "batch"}})
    return path
