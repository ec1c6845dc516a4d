"""A seeded, deterministic interaction generator with the shape of a real feed.

Model: items have Zipf popularity; users and items have latent vectors, and each user's vector
rotates slowly between two directions (preference drift, `drift_per_hour` radians per hour of
event time). Every impression is clicked with probability sigmoid(logit(base_ctr) + 2*affinity + user bias + item bias);
a click follows after an exponential delay and carries a dwell time that grows with affinity; a
clicked item is liked with probability `like_rate`. A small fraction of events arrive late
(out of order) by up to `out_of_order_max_ms`. The same seed and start time give the same events.

>>> from core.settings import SyntheticSettings
>>> a = generate(SyntheticSettings(seed=1, n_users=10, n_items=20), start_ms=0, n=50)
>>> b = generate(SyntheticSettings(seed=1, n_users=10, n_items=20), start_ms=0, n=50)
>>> a == b and len(a) == 50
True
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from core.settings import SyntheticSettings

Event = dict[str, Any]
CHUNK = 2048


class SyntheticEvents:
    """Endless iterator of InteractionEvent dicts in arrival order."""

    def __init__(self, cfg: SyntheticSettings, start_ms: int) -> None:
        self.cfg = cfg
        self.start_ms = start_ms
        rng = np.random.default_rng(cfg.seed)
        d = cfg.latent_dim
        self._user_a = rng.normal(size=(cfg.n_users, d)) / math.sqrt(d)
        self._user_b = rng.normal(size=(cfg.n_users, d)) / math.sqrt(d)
        self._user_phase = rng.uniform(0, 2 * math.pi, size=cfg.n_users)
        self._item_v = rng.normal(size=(cfg.n_items, d))
        self._user_bias = rng.normal(0.0, cfg.user_bias_std, size=cfg.n_users)
        self._item_bias = rng.normal(0.0, cfg.item_bias_std, size=cfg.n_items)
        ranks = np.arange(1, cfg.n_items + 1, dtype=np.float64)
        weights = ranks ** -cfg.zipf_exponent
        self._item_cdf = np.cumsum(weights) / weights.sum()
        self._item_by_rank = rng.permutation(cfg.n_items)
        self._rng = rng
        self._base_logit = math.log(cfg.base_ctr / (1 - cfg.base_ctr))
        self._next_time = float(start_ms)
        self._seq = 0
        self._pending: list[tuple[int, int, Event]] = []  # (arrival_ms, seq, event)

    def _affinity(self, users: np.ndarray, items: np.ndarray, t_ms: np.ndarray) -> np.ndarray:
        hours = (t_ms - self.start_ms) / 3_600_000.0
        angle = self._user_phase[users] + self.cfg.drift_per_hour * hours
        u = self._user_a[users] * np.cos(angle)[:, None] + self._user_b[users] * np.sin(angle)[:, None]
        return np.einsum("ij,ij->i", u, self._item_v[items])

    def _event(self, etype: str, user: int, item: int, t_ms: int, **extra: Any) -> Event:
        self._seq += 1
        return {"event_id": f"syn{self.cfg.seed}-{self.start_ms}-{self._seq}", "user_id": f"u{user}",
                "item_id": f"i{item}", "event_type": etype, "event_time": int(t_ms), "dwell_ms": extra.get("dwell_ms"),
                "position": extra.get("position"), "session_id": extra.get("session_id")}

    def _push(self, event: Event, late_ms: int = 0) -> None:
        heapq.heappush(self._pending, (event["event_time"] + late_ms, self._seq, event))

    def _generate_chunk(self) -> None:
        cfg, rng = self.cfg, self._rng
        gaps = rng.exponential(1000.0 / cfg.events_per_second_event_time, size=CHUNK)
        times = self._next_time + np.cumsum(gaps)
        self._next_time = float(times[-1])
        users = rng.integers(0, cfg.n_users, size=CHUNK)
        items = self._item_by_rank[np.searchsorted(self._item_cdf, rng.random(CHUNK))]
        affinity = self._affinity(users, items, times)
        logit = self._base_logit + 2.0 * affinity + self._user_bias[users] + self._item_bias[items]
        p_click = 1.0 / (1.0 + np.exp(-logit))
        clicked = rng.random(CHUNK) < p_click
        click_delay = rng.exponential(cfg.click_delay_mean_ms, size=CHUNK)
        dwell = rng.lognormal(mean=8.5 + 0.5 * np.clip(affinity, -2, 2), sigma=0.6, size=CHUNK)
        liked = rng.random(CHUNK) < cfg.like_rate
        like_delay = rng.exponential(cfg.click_delay_mean_ms, size=CHUNK)
        positions = rng.integers(1, 11, size=CHUNK)
        late = rng.random(CHUNK) < cfg.out_of_order_fraction
        late_by = rng.integers(1, cfg.out_of_order_max_ms + 1, size=CHUNK)
        for k in range(CHUNK):
            u, i, t = int(users[k]), int(items[k]), int(times[k])
            session = f"s{u}-{t // 1_800_000}"
            self._push(self._event("impression", u, i, t, position=int(positions[k]), session_id=session),
                       int(late_by[k]) if late[k] else 0)
            if clicked[k]:
                tc = t + int(click_delay[k]) + 1
                self._push(self._event("click", u, i, tc, dwell_ms=int(dwell[k]), position=int(positions[k]),
                                       session_id=session))
                if liked[k]:
                    self._push(self._event("like", u, i, tc + int(like_delay[k]) + 1, session_id=session))

    def __iter__(self) -> Iterator[Event]:
        while True:
            # Engagements lag impressions, so only release what no future chunk can precede.
            horizon = self._next_time
            while self._pending and self._pending[0][0] <= horizon:
                yield heapq.heappop(self._pending)[2]
            self._generate_chunk()


def generate(cfg: SyntheticSettings, start_ms: int, n: int) -> list[Event]:
    """The first `n` events."""
    out: list[Event] = []
    for event in SyntheticEvents(cfg, start_ms):
        out.append(event)
        if len(out) >= n:
            break
    return out
