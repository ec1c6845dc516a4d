from __future__ import annotations

from collections import Counter

import numpy as np

from core.settings import SyntheticSettings
from rtrec.sources.synthetic import generate

CFG = SyntheticSettings(seed=11, n_users=300, n_items=1000)


def test_same_seed_same_events_other_seed_other_events() -> None:
    a = generate(CFG, start_ms=1_700_000_000_000, n=5000)
    assert a == generate(CFG, start_ms=1_700_000_000_000, n=5000)
    b = generate(CFG.model_copy(update={"seed": 12}), start_ms=1_700_000_000_000, n=5000)
    assert [e["item_id"] for e in a] != [e["item_id"] for e in b]


def test_events_are_valid_and_ids_unique() -> None:
    events = generate(CFG, start_ms=1_700_000_000_000, n=5000)
    assert len({e["event_id"] for e in events}) == len(events)
    assert set(Counter(e["event_type"] for e in events)) == {"impression", "click", "like"}
    assert all(e["event_time"] >= 1_700_000_000_000 for e in events)


def test_item_popularity_is_skewed() -> None:
    events = generate(CFG, start_ms=0, n=20_000)
    counts = sorted(Counter(e["item_id"] for e in events if e["event_type"] == "impression").values(), reverse=True)
    top_decile = sum(counts[: len(counts) // 10]) / sum(counts)
    assert top_decile > 0.4


def test_engagements_follow_their_impression() -> None:
    events = generate(CFG, start_ms=0, n=20_000)
    first_impression: dict[tuple[str, str], int] = {}
    for e in sorted(events, key=lambda e: e["event_time"]):
        key = (e["user_id"], e["item_id"])
        if e["event_type"] == "impression":
            first_impression.setdefault(key, e["event_time"])
        else:
            assert key in first_impression and first_impression[key] < e["event_time"]
    clicks = [e for e in events if e["event_type"] == "click"]
    assert all(c["dwell_ms"] and c["dwell_ms"] > 0 for c in clicks)


def test_some_events_arrive_out_of_order_but_boundedly() -> None:
    events = generate(CFG, start_ms=0, n=20_000)
    times = np.array([e["event_time"] for e in events])
    running_max = np.maximum.accumulate(times)
    lateness = running_max - times
    assert (lateness > 0).mean() > 0.005
    # Out-of-order arrival is bounded by the configured lateness (plus the click delay window).
    assert lateness.max() <= CFG.out_of_order_max_ms + 1


def test_click_rate_depends_on_user_item_affinity() -> None:
    events = generate(CFG.model_copy(update={"n_users": 50, "n_items": 50}), start_ms=0, n=40_000)
    shown = Counter((e["user_id"], e["item_id"]) for e in events if e["event_type"] == "impression")
    clicked = Counter((e["user_id"], e["item_id"]) for e in events if e["event_type"] == "click")
    rates = [clicked[k] / n for k, n in shown.items() if n >= 20]
    assert np.std(rates) > 0.03  # personalised, not one global CTR
