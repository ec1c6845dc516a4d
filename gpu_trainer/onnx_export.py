"""Export of a snapshot's published model to ONNX (inputs: user bucket, item bucket, dense features).

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

    def forward(self, user_idx: torch.Tensor, item_idx: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.model(user_idx, item_idx, dense))


def export_onnx(loaded: LoadedModel, path: Path) -> Path:
    n_dense = int(loaded.manifest.model_config["n_dense"])
    example = (torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), torch.zeros(2, n_dense))
    wrapper = _Probability(loaded.model).eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter needs no onnxscript
        torch.onnx.export(wrapper, example, str(path), dynamo=False, input_names=["user_idx", "item_idx", "dense"],
                          output_names=["probability"], opset_version=17,
                          dynamic_axes={"user_idx": {0: "batch"}, "item_idx": {0: "batch"}, "dense": {0: "batch"},
                                        "probability": {0: "batch"}})
    return path
