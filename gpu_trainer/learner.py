"""One model learning incrementally: `step(batch)` scores the batch (prequential), then learns from it.

Order inside a step: forward -> record prequential metrics (of the trained weights and, with EMA, of
the published weights too, on the first `trainer.published_eval_rows` rows) -> skip on a non-finite
loss -> backward -> Fisher estimate from the data-loss gradient -> EWC penalty gradient -> optimiser
step -> EMA of the touched rows. The published weights are the EMA when it is on, else the trained
weights; the promotion gate judges `published_prequential`, the scores of the weights it would publish.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from core.settings import TrainerSettings
from gpu_trainer.batch import HISTORY_AGE_BUCKETS, HISTORY_TYPE_BUCKETS, Batch
from gpu_trainer.collisions import CollisionCounter
from gpu_trainer.device import amp_dtype, pick_device, set_torch_threads
from gpu_trainer.exchange import Alone, StepExchange
from gpu_trainer.models import build_model, sparse_tables
from gpu_trainer.prequential import Prequential, ScoreLog
from gpu_trainer.updates.ema import EMA
from gpu_trainer.updates.ewc import OnlineEWC
from gpu_trainer.updates.row_adam import RowSparseAdam


def model_config(cfg: TrainerSettings, n_dense: int) -> dict[str, Any]:
    config: dict[str, Any] = {"user_buckets": cfg.user_buckets, "item_buckets": cfg.item_buckets,
                              "n_dense": n_dense, "embedding_dim": cfg.embedding_dim}
    if cfg.history_length:
        config["history_length"] = cfg.history_length
    if cfg.model == "deepfm":
        config["hidden_dims"] = list(cfg.hidden_dims)
    if cfg.model == "din":
        config.update(history_length=cfg.history_length, type_buckets=HISTORY_TYPE_BUCKETS,
                      age_buckets=HISTORY_AGE_BUCKETS)
    return config


@dataclass
class StepResult:
    loss: float
    trained: bool


@torch.no_grad()
def is_finite(tensor: torch.Tensor) -> bool:
    """Whether every element is finite. A finite sum proves it (a NaN or an infinity makes the sum
    non-finite) at the cost of one pass without a mask; only a non-finite sum, which finite values
    can also give by overflowing, is checked element by element.

    >>> is_finite(torch.tensor([1.0, 3e38, 3e38])), is_finite(torch.tensor([1.0, float("nan")]))
    (True, False)
    """
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


class Learner:
    def __init__(self, cfg: TrainerSettings, n_dense: int, device: torch.device | None = None,
                 exchange: StepExchange | None = None) -> None:
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        # with other ranks each stepping on their own samples: every step is one step on all of them
        self.exchange: StepExchange = exchange or Alone()
        self.device = device or pick_device(cfg.device)
        self.amp = amp_dtype(self.device, cfg.amp)
        set_torch_threads(cfg.torch_threads)
        self.model_name = cfg.model
        self.config = model_config(cfg, n_dense)
        self.model: nn.Module = build_model(cfg.model, self.config).to(self.device)
        self.tables = sparse_tables(self.model)
        self.params = dict(self.model.named_parameters())
        sparse = [p for n, p in self.params.items() if n in self.tables]
        dense = [p for n, p in self.params.items() if n not in self.tables]
        self.optimizers: list[torch.optim.Optimizer] = [RowSparseAdam(sparse, lr=cfg.lr)]
        if dense:
            self.optimizers.append(torch.optim.Adam(dense, lr=cfg.dense_lr))
        names = set(self.tables)
        self.ema = EMA(self.params, cfg.ema_momentum, names) if cfg.ema_enabled else None
        self.ewc = (OnlineEWC(self.params, cfg.ewc_lambda, cfg.ewc_fisher_momentum, cfg.ewc_consolidation_decay,
                              names) if cfg.ewc_enabled else None)
        self.prequential = Prequential(cfg.eval_window)
        # the same span of samples as the trained weights' window, from a slice of each batch
        sliced = max(1_000, int(cfg.eval_window * min(1.0, cfg.published_eval_rows / cfg.batch_size)))
        self.published_prequential = Prequential(sliced) if self.ema is not None else self.prequential
        # The published weights as a model of their own: its parameters share storage with the EMA
        # shadow (updated in place), so scoring them costs one forward pass and no copying.
        self.published_model: nn.Module | None = None
        if self.ema is not None:
            self.published_model = build_model(cfg.model, self.config).to(self.device).eval()
            for name, param in self.published_model.named_parameters():
                param.requires_grad_(False)
                param.data = self.ema.shadow[name]
        # summed here and divided by all ranks' sample count: the gradient of the mean over all of them
        self.loss_fn = nn.BCEWithLogitsLoss(reduction="sum")
        self.samples_trained = 0
        self.non_finite_batches = 0
        self.collisions = {"user": CollisionCounter(cfg.user_buckets), "item": CollisionCounter(cfg.item_buckets)}
        self.sample_digest = 0  # sum of trained sample-id hashes mod 2**64: proves which samples, once each
        # the published weights' scores of the last batch's first published_eval_rows rows (before learning),
        # and their labels (with ranks: each rank's first rows, in rank order)
        self.last_published_scores: np.ndarray | None = None
        self.last_published_labels: np.ndarray | None = None
        # when set, every sample's score of the trained weights is kept (before learning from it)
        self.score_log: ScoreLog | None = None

    def _touched_rows(self, batch: Batch) -> dict[str, torch.Tensor]:
        """The rows of each table the batch reads: its users' in the user tables, its items' and recent
        items' in the item tables, every row of the small type and age tables."""
        users, items = torch.unique(batch.user_idx), torch.unique(batch.item_idx)
        if batch.history_idx is not None:
            recent = batch.history_idx[batch.history_idx >= 0]
            items = torch.unique(torch.cat([items, recent]))
        return self._rows(users, items)

    def _rows(self, users: torch.Tensor, items: torch.Tensor) -> dict[str, torch.Tensor]:
        rows = {n: (users if n.startswith("user") else items) for n in self.tables}
        for name, table in self.tables.items():
            if name.startswith("history_"):  # the recent items' type and age tables: a few rows, all touched
                rows[name] = torch.arange(table.num_embeddings, device=users.device)
        return rows

    def forward(self, batch: Batch, model: nn.Module | None = None) -> torch.Tensor:
        """Logits of the trained weights, or of `model` (the published one)."""
        with torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None):
            return (model or self.model)(*batch.model_inputs()).float()

    def _warm_start_bias(self, labels: np.ndarray) -> None:
        """Sets the output bias to the first batch's base rate (log-odds). Otherwise Adam's first steps,
        which move every weight by about lr whatever its gradient, push all feature weights the same
        way to fit the base rate, and a young model ranks backwards."""
        rate = float(np.clip(labels.mean(), 1e-4, 1 - 1e-4))
        init = getattr(self.model, "init_output_bias", None)
        if init is not None:
            init(float(np.log(rate / (1 - rate))))
            if self.ema is not None:
                for name, p in self.params.items():
                    if name not in self.tables:
                        self.ema.shadow[name].copy_(p.detach())

    def _shared(self, batch: Batch, logits: torch.Tensor, loss_sum: torch.Tensor) -> dict[str, np.ndarray]:
        """This batch's scores (of the trained weights, and of the published ones on its first
        published_eval_rows rows), labels and hashes, with every other rank's."""
        rows = min(len(batch), self.cfg.published_eval_rows)
        trained = torch.sigmoid(logits.detach()).cpu().numpy().astype(np.float64)
        published = trained[:rows]
        if self.published_model is not None:
            with torch.no_grad():
                published = torch.sigmoid(self.forward(batch.head(rows), self.published_model)).cpu().numpy()
        labels = batch.label.cpu().numpy()
        mine = {"score": trained, "label": labels, "time": batch.event_time_ms.numpy(),
                "published": published.astype(np.float64), "published_label": labels[:rows],
                "sample_hash": batch.sample_hash, "loss": np.array([float(loss_sum.detach())])}
        if self.ema is not None and self.exchange.distributed:  # the EMA moves the rows every rank's batch read
            touched = self._touched_rows(batch)
            mine.update(users=touched["user.weight"].cpu().numpy(), items=touched["item.weight"].cpu().numpy())
        if batch.user_hash is not None and batch.item_hash is not None:
            mine.update(user_hash=batch.user_hash, item_hash=batch.item_hash)
        return self.exchange.gather(mine)

    def step(self, batch: Batch) -> StepResult:
        batch = batch.to(self.device, non_blocking=True)
        if self.samples_trained == 0:
            first = self.exchange.gather({"label": batch.label.cpu().numpy(),
                                          "finite": np.array([bool(torch.isfinite(batch.dense).all())])})
            if first["finite"].all() and len(first["label"]):
                self._warm_start_bias(first["label"])
        self.model.train()
        logits = self.forward(batch)
        loss_sum = self.loss_fn(logits, batch.label)
        shared = self._shared(batch, logits, loss_sum)
        total = len(shared["label"])
        at_ms = int(shared["time"].max())
        self.prequential.update(shared["score"], shared["label"], at_ms)
        if self.score_log is not None:
            self.score_log.add(shared["sample_hash"], shared["time"], shared["score"], shared["label"])
        self.last_published_scores, self.last_published_labels = shared["published"], shared["published_label"]
        if self.published_model is not None:
            self.published_prequential.update(shared["published"], shared["published_label"], at_ms)
        if not np.isfinite(shared["loss"]).all():  # on any rank: every rank skips the batch
            self.non_finite_batches += 1
            return StepResult(float("nan"), trained=False)
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        (loss_sum / total).backward()
        self.exchange.reduce_grads(self.params, self.tables)
        if self.ewc is not None:
            self.ewc.observe({n: p.grad for n, p in self.params.items()}, batch_size=total)
            self.ewc.add_penalty_grad(self.params)
        for opt in self.optimizers:
            opt.step()
        if self.ema is not None:
            self.ema.update(self.params, self._touched_rows(batch) if not self.exchange.distributed else self._rows(
                torch.from_numpy(np.unique(shared["users"])).to(self.device),
                torch.from_numpy(np.unique(shared["items"])).to(self.device)))
        self.samples_trained += total
        if "user_hash" in shared:
            self.collisions["user"].update(shared["user_hash"])
            self.collisions["item"].update(shared["item_hash"])
        self.sample_digest = (self.sample_digest + int(shared["sample_hash"].sum(dtype=np.uint64))) % 2**64
        return StepResult(float(shared["loss"].sum()) / total, trained=True)

    @torch.no_grad()
    def predict(self, batch: Batch) -> np.ndarray:
        """Click probabilities from the published weights, what a snapshot taken now would serve."""
        model = self.published_model or self.model
        training = model.training
        model.eval()
        try:
            return torch.sigmoid(self.forward(batch.to(self.device), model)).cpu().numpy().astype(np.float64)
        finally:
            model.train(training)

    def published_state(self) -> dict[str, torch.Tensor]:
        return dict(self.ema.shadow) if self.ema is not None else {n: p.detach() for n, p in self.params.items()}

    def consolidate(self) -> None:
        if self.ewc is not None:
            self.ewc.consolidate(self.params)

    def weights_are_finite(self) -> bool:
        """Whether every trained and published weight is finite; without EMA both are the same
        tensors, checked once."""
        tensors = {t.data_ptr(): t for t in [*self.params.values(), *self.published_state().values()]}
        return all(is_finite(t) for t in tensors.values())

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Everything needed to resume: trained and published weights, EWC anchor and Fisher. Without
        EMA the trained weights are the published ones and are written once, as `published/`."""
        out = {f"trained/{n}": p.detach().cpu().numpy() for n, p in self.params.items()} if self.ema is not None \
            else {}
        out.update({f"published/{n}": t.cpu().numpy() for n, t in self.published_state().items()})
        if self.ewc is not None:
            out.update({f"ewc_fisher/{n}": t.cpu().numpy() for n, t in self.ewc.fisher.items()})
            out.update({f"ewc_anchor/{n}": t.cpu().numpy() for n, t in self.ewc.anchor.items()})
        return out

    @torch.no_grad()
    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        for n, p in self.params.items():  # snapshots written without EMA hold them as published/ only
            p.copy_(torch.from_numpy(arrays.get(f"trained/{n}", arrays[f"published/{n}"])))
        if self.ema is not None:
            self.ema.load({n: torch.from_numpy(arrays[f"published/{n}"]) for n in self.params})
        if self.ewc is not None and f"ewc_fisher/{next(iter(self.params))}" in arrays:
            self.ewc.load({n: torch.from_numpy(arrays[f"ewc_fisher/{n}"]) for n in self.params},
                          {n: torch.from_numpy(arrays[f"ewc_anchor/{n}"]) for n in self.params})
