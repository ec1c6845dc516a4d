"""The trainer service against the real broker and Redis (its logic alone: test_service.py)."""

from __future__ import annotations

import math
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from confluent_kafka import Producer

from core.settings import Settings
from feature_store.redis_store import RedisFeatureStore
from gpu_trainer.model_registry import ModelRegistry
from gpu_trainer.onnx_export import export_onnx
from gpu_trainer.scoring import Recent, feature_matrix, load_current, load_snapshot
from gpu_trainer.service import TrainerService
from gpu_trainer.snapshots import SnapshotStore
from rtrec.cli.main import cli
from schemas.kafka_io import read_topic
from tests.gpu_trainer.samples import digest, make_samples, produce_samples
from tests.infra import free_port

pytestmark = pytest.mark.integration


def trainer_settings(settings: Settings, tmp_path: Path, **kw: object) -> Settings:
    trainer = settings.trainer.model_copy(update={
        "snapshot_dir": tmp_path / "snapshots", "user_buckets": 4096, "item_buckets": 4096, "batch_size": 200,
        "lr": 0.05, "dense_lr": 0.05,
        "batch_timeout_ms": 200, "snapshot_every_samples": 2000, "snapshot_every_s": 60.0, "eval_window": 2000,
        "group_id": f"trainer-{tmp_path.name}", **kw})
    return settings.model_copy(update={"trainer": trainer})


def env_of(s: Settings) -> dict[str, str]:
    return {"RTREC_KAFKA__BOOTSTRAP_SERVERS": s.kafka.bootstrap_servers, "RTREC_REDIS__URL": s.redis.url,
            "RTREC_REDIS__KEY_PREFIX": s.redis.key_prefix, "RTREC_TRAINER__SNAPSHOT_DIR": str(s.trainer.snapshot_dir),
            **{f"RTREC_KAFKA__TOPICS__{k.upper()}": v for k, v in s.kafka.topics.model_dump().items()}}


def test_trains_every_sample_once_dead_letters_bad_ones_and_publishes(settings: Settings, tmp_path: Path) -> None:
    s = trainer_settings(settings, tmp_path, metrics_port=free_port())
    good = make_samples(5000)
    bad = [dict(make_samples(1, start=90_000)[0], features=[math.nan] * 20),
           dict(make_samples(1, start=90_001)[0], features=[1.0, 2.0]),
           dict(make_samples(1, start=90_002)[0], features=[math.inf] + [0.0] * 19)]
    produce_samples(s, good[:2500] + bad + good[2500:])
    raw = Producer({"bootstrap.servers": s.kafka.bootstrap_servers})
    raw.produce(s.kafka.topics.samples, value=b"\x00garbage")
    raw.flush(10)

    service = TrainerService.from_settings(s)
    summary = service.run(idle_exit_s=3.0)
    assert summary.samples_trained == 5000 and summary.dead_lettered == 4
    store = SnapshotStore(s.trainer.snapshot_dir)
    last = store.manifest(store.latest_version())
    assert last.samples_seen == 5000 and last.sample_digest == digest(good)
    assert sum(o["offset"] for o in last.offsets) == 5004
    assert last.metrics["auc"] > 0.6
    # 50 users and 80 items in 4096 rows: a few may share one (birthday bound), most do not
    assert 0.0 <= last.metrics["user_collision_rate"] < 0.1 and 0.0 <= last.metrics["item_collision_rate"] < 0.1

    announced = read_topic(s.kafka.bootstrap_servers, s.kafka.topics.snapshots, "ModelSnapshot").records
    assert [r["version"] for r in announced] == summary.snapshots
    assert announced[-1]["manifest_sha256"] == store.manifest_sha256(last.version)
    assert ModelRegistry(store, s.redis.url, s.redis.key_prefix).current_version() == summary.promoted[-1]

    dead = read_topic(s.kafka.bootstrap_servers, s.kafka.topics.dead_letter, "DeadLetter").records
    reasons = sorted(d["reason"] for d in dead)
    assert any("non-finite feature value" in r and "s90000" in r for r in reasons)
    assert any("expected 20 features, got 2" in r for r in reasons)
    assert any("s90002" in r for r in reasons)
    assert any(r.startswith("missing rtrec-schema header") for r in reasons)

    scraped = urllib.request.urlopen(f"http://127.0.0.1:{s.trainer.metrics_port}/metrics", timeout=5).read().decode()
    for name in ("rtrec_trainer_samples_total 5000.0", "rtrec_trainer_dead_lettered_total 4.0",
                 "rtrec_trainer_prequential_auc", "rtrec_trainer_consumer_lag", "rtrec_trainer_batch_seconds_bucket",
                 f"rtrec_trainer_snapshot_version {float(last.version)}", "rtrec_trainer_freshness_seconds",
                 "rtrec_trainer_samples_per_second", "rtrec_trainer_prequential_logloss",
                 'rtrec_trainer_embedding_collision_rate{table="user"}'):
        assert name in scraped, name


@pytest.mark.parametrize("model", ["mf", "din"])
def test_a_model_reading_recent_items_trains_publishes_and_scores(settings: Settings, tmp_path: Path,
                                                                  model: str) -> None:
    s = trainer_settings(settings, tmp_path, history_length=3, model=model)
    samples = make_samples(4000, seed=7)
    produce_samples(s, samples)
    summary = TrainerService.from_settings(s).run(idle_exit_s=3.0)
    assert summary.samples_trained == 4000 and summary.dead_lettered == 0
    store = SnapshotStore(s.trainer.snapshot_dir)
    loaded = load_snapshot(store, store.latest_version())  # the final one: every sample trained
    assert loaded.history_length == 3 and loaded.manifest.sample_digest == digest(samples)
    scores = loaded.score_samples(samples[-500:])
    assert np.isfinite(scores).all()
    without = loaded.score_samples([dict(r, recent_items=[]) for r in samples[-500:]])
    assert not np.allclose(scores, without)  # the recent items move the scores
    if model == "din":  # trained on the types and ages it decoded: told none, it scores otherwise
        unknown = loaded.score_samples([dict(r, recent_types=[], recent_ages_ms=[]) for r in samples[-500:]])
        assert not np.allclose(scores, unknown)

    # served: `model score` reads the user's list from the online store, cut as the samples' are
    current = load_current(ModelRegistry(store, s.redis.url, s.redis.key_prefix))  # what `model score` uses
    online = RedisFeatureStore(s.redis.url, s.redis.key_prefix, 600)
    now = int(time.time() * 1000)
    listed = ["i3", "i1", "i2", "i4"]
    online.write_batch([{
        "entity_type": "user", "entity_id": "u1", "horizon_s": 0, "window_start": now - 3000, "window_end": now,
        "impressions": 0, "clicks": 0, "likes": 0, "carts": 0, "orders": 0, "ctr": 0.0, "dwell_sum_ms": 0,
        "dwell_mean_ms": 0.0, "distinct_counterparts": 0, "dwell_count": 0, "recent_items": [*listed, "i9"],
        "recent_types": ["click"] * 5, "recent_times_ms": [now - 10, now - 20, now - 30, now - 40, now - 7_200_000]}])
    result = CliRunner().invoke(cli, ["model", "score", "--user", "u1", "--items", "i1,i2"], env=env_of(s))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1] == "recent items (online store): i3,i1,i2"  # the model reads 3; i9 is past the lookback
    printed = dict(line.split("\t") for line in lines[2:])
    # the ages the store's times give at scoring time: all under a second, one age bucket
    served = current.score_arrays(["u1", "u1"], ["i1", "i2"], feature_matrix(online, "u1", ["i1", "i2"]),
                                  Recent(listed[:3], ["click"] * 3, [10, 20, 30]))
    assert [float(printed[i]) for i in ("i1", "i2")] == pytest.approx(served.tolist(), abs=1e-6)
    given = CliRunner().invoke(cli, ["model", "score", "--user", "u1", "--items", "i1", "--recent", ""], env=env_of(s))
    assert given.output.splitlines()[1] == "recent items (given): "
    # given with their types and ages (read by din), as the samples carry them
    typed = CliRunner().invoke(cli, ["model", "score", "--user", "u1", "--items", "i1,i2", "--recent", "i4,i2",
                                     "--recent-types", "order,click", "--recent-ages-ms", "5000,90000"], env=env_of(s))
    assert typed.exit_code == 0, typed.output
    printed = dict(line.split("\t") for line in typed.output.splitlines()[2:])
    expected = current.score_arrays(["u1", "u1"], ["i1", "i2"], feature_matrix(online, "u1", ["i1", "i2"]),
                                    Recent(["i4", "i2"], ["order", "click"], [5000, 90000]))
    assert [float(printed[i]) for i in ("i1", "i2")] == pytest.approx(expected.tolist(), abs=1e-6)
    for wrong, says in ((["--recent-types", "click"], "go with --recent"),
                        (["--recent", "i4,i2", "--recent-ages-ms", "5000"], "one value per --recent item (2), got 1"),
                        (["--recent", "i4", "--recent-ages-ms", "soon"], "whole milliseconds")):
        refused = CliRunner().invoke(cli, ["model", "score", "--user", "u1", "--items", "i1", *wrong], env=env_of(s))
        assert refused.exit_code == 2 and says in refused.output, refused.output


def test_restart_resumes_from_the_snapshot_offsets(settings: Settings, tmp_path: Path) -> None:
    s = trainer_settings(settings, tmp_path)
    samples = make_samples(6000)
    produce_samples(s, samples)
    first = TrainerService.from_settings(s).run(max_samples=2000)
    assert 2000 <= first.samples_trained < 6000
    second = TrainerService.from_settings(s)
    assert second.resume() == first.snapshots[-1]
    summary = second.run(idle_exit_s=3.0)
    assert summary.samples_trained == 6000
    store = SnapshotStore(s.trainer.snapshot_dir)
    assert store.manifest(store.latest_version()).sample_digest == digest(samples)


def test_blocks_of_samples_train_the_same_model_as_one_message_per_sample(settings: Settings, tmp_path: Path) -> None:
    samples = make_samples(3000, seed=4)
    runs = {}
    for per_message in (1, 100):  # blocks of 100, two to each batch of 200: the same batches in the same order
        s = trainer_settings(settings.namespaced(f"m{per_message}"), tmp_path / str(per_message))
        s = s.model_copy(update={"kafka": s.kafka.model_copy(update={"partitions": 1})})
        produce_samples(s, samples, per_message=per_message)
        summary = TrainerService.from_settings(s).run(max_samples=3000, idle_exit_s=3.0)
        store = SnapshotStore(s.trainer.snapshot_dir)
        last = store.manifest(store.latest_version())
        runs[per_message] = (summary.samples_trained, last.sample_digest, last.metrics["auc"], last.metrics["logloss"],
                             store.load(last.version)[1])
    (n, digest_1, auc_1, loss_1, arrays_1), (m, digest_100, auc_100, loss_100, arrays_100) = runs[1], runs[100]
    assert n == m == 3000 and digest_1 == digest_100 == digest(samples)
    assert (auc_1, loss_1) == (auc_100, loss_100) and auc_1 > 0.6
    assert arrays_1.keys() == arrays_100.keys() and all(np.array_equal(arrays_1[k], arrays_100[k]) for k in arrays_1)


def test_metric_gate_keeps_a_worse_snapshot_unpromoted_and_rollback(settings: Settings, tmp_path: Path) -> None:
    s = trainer_settings(settings, tmp_path, promotion_margin=0.02)
    produce_samples(s, make_samples(6000, seed=1))
    good = TrainerService.from_settings(s).run(idle_exit_s=3.0)
    assert good.promoted == good.snapshots
    produce_samples(s, make_samples(4000, seed=2, start=10_000, random_labels=True))
    worse = TrainerService.from_settings(s).run(idle_exit_s=3.0)
    store = SnapshotStore(s.trainer.snapshot_dir)
    assert worse.snapshots and not store.manifest(worse.snapshots[-1]).promoted
    registry = ModelRegistry(store, s.redis.url, s.redis.key_prefix)
    assert registry.current_version() == good.promoted[-1]

    runner = CliRunner()
    result = runner.invoke(cli, ["model", "rollback", "--to", str(good.snapshots[0])], env=env_of(s))
    assert result.exit_code == 0, result.output
    assert registry.current_version() == good.snapshots[0]
    listing = runner.invoke(cli, ["model", "list"], env=env_of(s)).output
    assert any(line.startswith("*") and f" {good.snapshots[0]} " in line for line in listing.splitlines())
    missing = runner.invoke(cli, ["model", "rollback", "--to", "999"], env=env_of(s))
    assert missing.exit_code != 0 and "no snapshot v999" in missing.output


def test_score_cli_and_onnx_match_pytorch(settings: Settings, tmp_path: Path) -> None:
    s = trainer_settings(settings, tmp_path, model="deepfm")
    produce_samples(s, make_samples(3000))
    TrainerService.from_settings(s).run(idle_exit_s=3.0)
    features = RedisFeatureStore.from_settings(s.redis, s.flink)
    features.write_batch([  # one tile per horizon: 3 s of the 60 s, 30 s of the 600 s
        {"entity_type": et, "entity_id": eid, "horizon_s": h, "window_start": 60_000 - tile, "window_end": 60_000,
         "impressions": 10 + k, "clicks": k, "likes": 1, "carts": 0, "orders": 0, "ctr": k / (10 + k),
         "dwell_sum_ms": 1000 * k, "dwell_mean_ms": 1000.0, "distinct_counterparts": 3, "dwell_count": k}
        for k, (et, eid) in enumerate([("user", "u1"), ("item", "i1"), ("item", "i2")])
        for h, tile in ((60, 3000), (600, 30_000))])
    result = CliRunner().invoke(cli, ["model", "score", "--user", "u1", "--items", "i1,i2,i-unknown"], env=env_of(s))
    assert result.exit_code == 0, result.output
    printed = dict(line.split("\t") for line in result.output.splitlines()[1:])

    loaded = load_current(ModelRegistry(SnapshotStore(s.trainer.snapshot_dir), s.redis.url, s.redis.key_prefix))
    dense = feature_matrix(features, "u1", ["i1", "i2", "i-unknown"])
    assert dense[0, 0] == 10.0 and dense[2, 10:].sum() == 0.0  # the unknown item's features are zeros
    expected = loaded.score_arrays(["u1"] * 3, ["i1", "i2", "i-unknown"], dense)
    assert [float(printed[i]) for i in ("i1", "i2", "i-unknown")] == pytest.approx(expected.tolist(), abs=1e-6)

    path = export_onnx(loaded, tmp_path / "model.onnx")
    from gpu_trainer.batch import bucket

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ids = [f"u{k}" for k in range(64)], [f"i{k}" for k in range(64)]
    dense = np.random.default_rng(0).random((64, 20)).astype(np.float32) * 50
    onnx_scores = session.run(None, {"user_idx": bucket(ids[0], loaded.user_buckets),
                                     "item_idx": bucket(ids[1], loaded.item_buckets), "dense": dense})[0]
    np.testing.assert_allclose(onnx_scores, loaded.score_arrays(ids[0], ids[1], dense), rtol=1e-5, atol=1e-6)
