"""The models read a sample's recent items: on a stream where only the recent items tell a user's
taste (every user is new), a model reading them ranks and one without cannot; scoring a snapshot
and the row-sparse bookkeeping see the same inputs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from core.settings import TrainerSettings
from gpu_trainer.batch import COLUMN_SOURCES, HISTORY_SOURCES, Columns, bucket
from gpu_trainer.learner import Learner
from gpu_trainer.onnx_export import export_onnx
from gpu_trainer.prequential import auc
from gpu_trainer.scoring import LoadedModel, Recent
from tests.gpu_trainer.samples import signal_records


def taste_stream(n: int, rng: np.random.Generator, offset: int, items: int = 40, recent: int = 5) -> Columns:
    """Two clusters of items; each sample's user is new and has engaged with `recent` items of one
    cluster; the candidate is clicked mostly when it is of that cluster."""
    taste = rng.integers(0, 2, n)
    candidate = rng.integers(0, 2 * items, n)
    history = taste[:, None] * items + rng.integers(0, items, (n, recent))
    p = np.where(candidate // items == taste, 0.8, 0.1)
    records = [{"sample_id": f"s{offset + k}", "user_id": f"u{offset + k}", "item_id": f"i{candidate[k]}",
                "features": [0.0, 0.0], "label": int(rng.random() < p[k]), "event_time": offset + k,
                "feature_set": "v1", "recent_items": [f"i{j}" for j in history[k]]} for k in range(n)]
    return Columns.from_records(records, width=2, history_length=recent)


def prequential_auc(model: str, history_length: int, stream: Callable[[np.random.Generator, int], Columns],
                    steps: int = 40, scored_from: int = 25) -> float:
    """The prequential AUC of `model` over batches `scored_from` to `steps` of 256 samples of `stream`."""
    cfg = TrainerSettings(model=model, history_length=history_length, user_buckets=1 << 16, item_buckets=1024,
                          embedding_dim=8, lr=0.05)
    learner = Learner(cfg, n_dense=2, device=torch.device("cpu"))
    rng = np.random.default_rng(0)
    scores, labels = [], []
    for k in range(steps):
        batch = stream(rng, k * 256).to_batch(cfg.user_buckets, cfg.item_buckets)
        if k >= scored_from:
            scores.append(learner.predict(batch))
            labels.append(batch.label.numpy())
        learner.step(batch)
    value = auc(np.concatenate(scores), np.concatenate(labels))
    assert value is not None
    return value


@pytest.mark.parametrize("model", ["mf", "deepfm"])
def test_a_model_reading_recent_items_learns_tastes_a_model_without_them_cannot(model: str) -> None:
    def tastes(rng: np.random.Generator, offset: int) -> Columns:
        return taste_stream(256, rng, offset)

    reading, blind = prequential_auc(model, 5, tastes), prequential_auc(model, 0, tastes)
    assert reading > 0.75 and blind < 0.6, (reading, blind)


def test_short_histories_pad_and_old_samples_have_none() -> None:
    records = [{"sample_id": "a", "user_id": "u", "item_id": "i", "features": [1.0], "label": 1, "event_time": 1,
                "feature_set": "v1", "recent_items": ["x", "y", "z"]},
               {"sample_id": "b", "user_id": "u", "item_id": "i", "features": [1.0], "label": 0, "event_time": 2,
                "feature_set": "v1"}]
    batch = Columns.from_records(records, width=1, history_length=2).to_batch(8, 64)
    assert batch.history_idx is not None and batch.history_idx.shape == (2, 2)
    assert (batch.history_idx[0] >= 0).all() and (batch.history_idx[1] == -1).all()
    assert Columns.from_records(records, width=1).to_batch(8, 64).history_idx is None


def test_the_recent_items_rows_count_as_touched() -> None:
    cfg = TrainerSettings(history_length=3, user_buckets=64, item_buckets=64, ema_enabled=True)
    learner = Learner(cfg, n_dense=2, device=torch.device("cpu"))
    batch = taste_stream(32, np.random.default_rng(1), 0, recent=3).to_batch(64, 64)
    assert batch.history_idx is not None
    touched = learner._touched_rows(batch)["item.weight"]
    assert set(batch.history_idx.flatten().tolist()) <= set(touched.tolist())


def test_scoring_and_onnx_feed_the_recent_items(tmp_path: Path) -> None:
    import onnxruntime as ort

    cfg = TrainerSettings(history_length=5, user_buckets=1 << 10, item_buckets=1024, embedding_dim=8, lr=0.05)
    learner = Learner(cfg, n_dense=2, device=torch.device("cpu"))
    rng = np.random.default_rng(2)
    for k in range(20):
        learner.step(taste_stream(256, rng, k * 256).to_batch(cfg.user_buckets, cfg.item_buckets))
    loaded = LoadedModel(SimpleNamespace(model_config=learner.config), learner.model)  # type: ignore[arg-type]
    candidates = [f"i{k}" for k in range(80)]
    dense = np.zeros((80, 2), np.float32)
    for taste in (0, 1):
        recent = [f"i{taste * 40 + k}" for k in range(5)]
        scores = loaded.score_arrays(["new-user"] * 80, candidates, dense, Recent(recent))
        assert scores[taste * 40:(taste + 1) * 40].mean() > scores[(1 - taste) * 40:(2 - taste) * 40].mean() + 0.2
        records = [{"sample_id": "s", "user_id": "new-user", "item_id": c, "features": [0.0, 0.0], "label": 0,
                    "event_time": 1, "feature_set": "v1", "recent_items": recent} for c in candidates]
        np.testing.assert_allclose(loaded.score_samples(records), scores, rtol=1e-6)
        path = export_onnx(loaded, tmp_path / f"model-{taste}.onnx")
        session = ort.InferenceSession(str(path))
        history = loaded.history_inputs(Recent(recent), 80)[0]
        assert history is not None
        got = session.run(None, {"user_idx": bucket(["new-user"] * 80, loaded.user_buckets),
                                 "item_idx": bucket(candidates, loaded.item_buckets), "dense": dense,
                                 "history_idx": history.numpy()})[0]
        np.testing.assert_allclose(got, scores, rtol=1e-5, atol=1e-6)


def signal_stream(n: int, rng: np.random.Generator, offset: int, signal: str) -> Columns:
    return Columns.from_records(signal_records(n, rng, offset, signal), width=2, history_length=5)


def signal_auc(model: str, signal: str) -> float:
    return prequential_auc(model, 5, lambda rng, offset: signal_stream(256, rng, offset, signal), 60, 40)


def test_din_finds_the_telling_recent_item_by_its_type_or_age_where_mean_pooling_cannot() -> None:
    pooling = signal_auc("mf", "type")  # reads neither types nor ages: the same on either stream
    for signal in ("type", "age"):
        attending = signal_auc("din", signal)
        assert attending > 0.75 and attending > pooling + 0.1, (signal, attending, pooling)


def test_the_bulk_decoded_samples_carry_the_same_history_as_the_records() -> None:
    """The trainer decodes in bulk; scoring and evaluation build columns from records: one history."""
    from schemas.bulk import BulkDecoder
    from schemas.serde import serializer

    columns = signal_stream(50, np.random.default_rng(3), 0, "type")
    records = [{"sample_id": str(columns.sample_id[k]), "user_id": str(columns.user_id[k]),
                "item_id": str(columns.item_id[k]), "event_time": int(columns.event_time_ms[k]),
                "label": int(columns.label[k]), "features": [0.0, 0.0], "feature_set": "v1", "position": None,
                "recent_items": [f"i{k}", "x"][: k % 3], "recent_types": ["order", "click"][: k % 3],
                "recent_ages_ms": [5_000, 90_000][: k % 3]} for k in range(50)]
    records[8]["recent_types"] = ["like"]  # one type for two items: both read as not known
    encode = serializer("TrainingSample")
    decoded = BulkDecoder("TrainingSample", keep=COLUMN_SOURCES + HISTORY_SOURCES).decode(
        [encode(r) for r in records], [encode.header_value] * 50, widths={"features": 2})
    bulk = Columns.from_decoded(decoded, 2, history_length=3).to_batch(64, 64)
    one_by_one = Columns.from_records(records, width=2, history_length=3).to_batch(64, 64)
    for name in ("history_idx", "history_type", "history_age"):
        assert torch.equal(getattr(bulk, name), getattr(one_by_one, name)), name
    assert bulk.history_type is not None and bulk.history_age is not None
    assert bulk.history_type[8].tolist() == [0, 0, 0] and bulk.history_age[8].tolist() == [3, 7, 0]
    assert bulk.history_type[2, 0] != bulk.history_type[2, 1] and bulk.history_age[2, 0] < bulk.history_age[2, 1]


def test_din_scoring_and_onnx_read_the_types_and_ages(tmp_path: Path) -> None:
    import onnxruntime as ort

    cfg = TrainerSettings(model="din", history_length=5, user_buckets=1 << 10, item_buckets=1024, embedding_dim=8,
                          lr=0.05)
    learner = Learner(cfg, n_dense=2, device=torch.device("cpu"))
    rng = np.random.default_rng(4)
    for k in range(60):
        learner.step(signal_stream(256, rng, k * 256, "type").to_batch(cfg.user_buckets, cfg.item_buckets))
    loaded = LoadedModel(SimpleNamespace(model_config=learner.config), learner.model)  # type: ignore[arg-type]
    assert loaded.reads_types_and_ages
    candidates = [f"i{k}" for k in range(80)]
    dense = np.zeros((80, 2), np.float32)
    items = ["i0", "i25", "i45", "i65"]  # one of each cluster; which one is the order tells the taste
    for taste in range(4):
        recent = Recent(items, ["order" if k == taste else "click" for k in range(4)], [60_000] * 4)
        scores = loaded.score_arrays(["new-user"] * 80, candidates, dense, recent)
        ours = scores[taste * 20:(taste + 1) * 20].mean()
        assert ours > np.delete(scores, np.s_[taste * 20:(taste + 1) * 20]).mean() + 0.1, taste
        records = [{"sample_id": "s", "user_id": "new-user", "item_id": c, "features": [0.0, 0.0], "label": 0,
                    "event_time": 1, "feature_set": "v1", "recent_items": list(recent.items),
                    "recent_types": list(recent.types), "recent_ages_ms": list(recent.ages_ms)} for c in candidates]
        np.testing.assert_allclose(loaded.score_samples(records), scores, rtol=1e-6)
        # told nothing of types and ages, the model scores otherwise
        assert not np.allclose(loaded.score_arrays(["new-user"] * 80, candidates, dense, Recent(recent.items)), scores)
        path = export_onnx(loaded, tmp_path / f"din-{taste}.onnx")
        history, types_in, ages_in = loaded.history_inputs(recent, 80)
        assert history is not None and types_in is not None and ages_in is not None
        got = ort.InferenceSession(str(path)).run(None, {
            "user_idx": bucket(["new-user"] * 80, loaded.user_buckets),
            "item_idx": bucket(candidates, loaded.item_buckets),
            "dense": dense, "history_idx": history.numpy(), "history_type": types_in.numpy(),
            "history_age": ages_in.numpy()})[0]
        np.testing.assert_allclose(got, scores, rtol=1e-5, atol=1e-6)


def test_din_needs_the_recent_items() -> None:
    with pytest.raises(ValueError, match="history_length"):
        TrainerSettings(model="din")
