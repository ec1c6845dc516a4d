"""A test producer of TrainingSamples (the feature job's output) with a learnable signal."""

from __future__ import annotations

import numpy as np

from core.kafka import ensure_topics, producer_config
from core.settings import Settings
from gpu_trainer.batch import hash_ids
from schemas.feature_set import FEATURE_NAMES, FEATURE_SET
from schemas.kafka_io import AvroProducer
from schemas.sample_blocks import BLOCK_SCHEMA, pack


def make_samples(n: int, seed: int = 0, start: int = 0, random_labels: bool = False,
                 event_time_ms: int = 1_700_000_000_000) -> list[dict]:
    rng = np.random.default_rng(seed)
    users, items = rng.integers(0, 50, n), rng.integers(0, 80, n)
    world = np.random.default_rng(1234)  # fixed across calls: one world
    taste = world.normal(size=(50, 3)) @ world.normal(size=(3, 80))
    features = rng.random((n, len(FEATURE_NAMES))).astype(np.float32) * 10
    p = 1 / (1 + np.exp(-(taste[users, items] + 0.8 * (features[:, 0] - 5.0) - 1.0)))
    labels = (rng.random(n) < (0.3 if random_labels else p)).astype(int)
    recent = rng.integers(0, 4, n)  # as the job writes them: the user's newest engaged items
    liked = np.argsort(-taste[users], axis=1)[:, :3]
    return [{"sample_id": f"s{start + k}", "user_id": f"u{users[k]}", "item_id": f"i{items[k]}",
             "event_time": event_time_ms + start + k, "label": int(labels[k]), "features": features[k].tolist(),
             "feature_set": FEATURE_SET, "position": None,
             "recent_items": [f"i{j}" for j in liked[k, :recent[k]]], "recent_types": ["click"] * int(recent[k]),
             "recent_ages_ms": [1000 * (j + 1) for j in range(recent[k])]} for k in range(n)]


def signal_records(n: int, rng: np.random.Generator, offset: int, signal: str, clusters: int = 4, items: int = 20,
                   recent: int = 5) -> list[dict]:
    """Every user is new, with `recent` engaged items of random clusters, one of which (at a random
    place in the list) is of the user's taste; the candidate is clicked mostly when it is of that
    taste. `signal` says what marks the telling item: its event type ("type": an order among clicks)
    or its age ("age": a minute old among hour-old ones)."""
    taste = rng.integers(0, clusters, n)
    candidate = rng.integers(0, clusters * items, n)
    history = rng.integers(0, clusters, (n, recent)) * items + rng.integers(0, items, (n, recent))
    telling = rng.integers(0, recent, n)
    history[np.arange(n), telling] = taste * items + rng.integers(0, items, n)
    p = np.where(candidate // items == taste, 0.8, 0.1)
    records = []
    for k in range(n):
        types, ages = ["click"] * recent, [3_600_000 - j for j in range(recent)]
        if signal == "type":
            types[telling[k]], ages = "order", [60_000] * recent
        else:
            ages[telling[k]] = 60_000
        records.append({"sample_id": f"s{offset + k}", "user_id": f"u{offset + k}", "item_id": f"i{candidate[k]}",
                        "features": [0.0, 0.0], "label": int(rng.random() < p[k]), "event_time": offset + k,
                        "feature_set": "v1", "recent_items": [f"i{j}" for j in history[k]],
                        "recent_types": types, "recent_ages_ms": ages})
    return records


def produce_samples(settings: Settings, samples: list[dict], per_message: int = 1) -> None:
    """One message per sample keyed by user, or (`per_message` > 1) TrainingSampleBlocks of that many,
    each keyed by its first sample's id, as the feature job writes them."""
    k = settings.kafka
    ensure_topics(k.bootstrap_servers, [k.topics.samples], k.partitions)
    if per_message == 1:
        producer = AvroProducer(producer_config(k.bootstrap_servers), k.topics.samples, "TrainingSample")
        producer.produce_many(samples, key=lambda s: s["user_id"])
    else:
        producer = AvroProducer(producer_config(k.bootstrap_servers), k.topics.samples, BLOCK_SCHEMA)
        for start in range(0, len(samples), per_message):
            part = samples[start:start + per_message]
            producer.produce(pack(part), key=part[0]["sample_id"])
    producer.flush()


def digest(samples: list[dict]) -> str:
    ids = np.array([s["sample_id"] for s in samples], dtype=object)
    return f"{int(hash_ids(ids).sum(dtype=np.uint64)) % 2**64:016x}"
