"""Each thread keeps the connection it took (feature_store.thread_connections), against a real Redis:
seen from the server's side, by the connections' client name."""

from __future__ import annotations

import multiprocessing
import threading
import uuid

import pytest
import redis

from core.settings import Settings
from feature_store import resp
from feature_store.redis_store import RedisFeatureStore

pytestmark = pytest.mark.integration


@pytest.fixture
def named(settings: Settings) -> tuple[RedisFeatureStore, str]:
    name = f"held-{uuid.uuid4().hex[:8]}"
    store = RedisFeatureStore(settings.redis.url, settings.redis.key_prefix, ttl_s=600,
                              connection={"client_name": name})
    store.write_batch([{"entity_type": "user", "entity_id": "h1", "horizon_s": 60, "window_start": 0,
                        "window_end": 60_000, "impressions": 10, "clicks": 4, "likes": 0, "carts": 0, "orders": 0,
                        "ctr": 0.4, "dwell_sum_ms": 0, "dwell_mean_ms": 0.0, "distinct_counterparts": 1,
                        "dwell_count": 0}])
    return store, name


def connection_ids(settings: Settings, name: str) -> set[int]:
    admin = redis.Redis.from_url(settings.redis.url)
    try:
        return {int(c["id"]) for c in admin.client_list() if c.get("name") == name}
    finally:
        admin.close()


def clicks(store: RedisFeatureStore) -> float:
    return float(store.get_online_features("user", ["h1"], ["60s.clicks"]).values[0, 0])


def test_a_thread_keeps_its_connection_and_an_ended_thread_hands_it_back(named: tuple[RedisFeatureStore, str],
                                                                         settings: Settings) -> None:
    store, name = named
    writes = connection_ids(settings, name)  # the write's, back in the pool: the first read takes one
    assert [clicks(store) for _ in range(20)] == [4.0] * 20
    assert connection_ids(settings, name) == writes

    got: list[float] = []
    for _ in range(5):  # one after another: each takes the connection the one before handed back
        thread = threading.Thread(target=lambda: got.extend(clicks(store) for _ in range(3)))
        thread.start()
        thread.join(timeout=30)
    assert got == [4.0] * 15
    # the main thread's and one the threads shared in turn: one each would have left six
    assert len(connection_ids(settings, name)) == max(2, len(writes))


def test_a_connection_the_server_closed_is_replaced_before_the_next_read(named: tuple[RedisFeatureStore, str],
                                                                         settings: Settings) -> None:
    store, name = named
    assert clicks(store) == 4.0
    before = connection_ids(settings, name)
    admin = redis.Redis.from_url(settings.redis.url)
    for client_id in before:
        admin.client_kill_filter(_id=client_id)  # as a Redis restart would
    admin.close()
    assert clicks(store) == 4.0  # no error reaches the caller
    after = connection_ids(settings, name)
    assert after and not after & before


def test_an_error_inside_a_read_drops_the_connection(named: tuple[RedisFeatureStore, str], settings: Settings,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    store, name = named
    assert clicks(store) == 4.0
    before = connection_ids(settings, name)

    def timed_out(*_: object) -> None:
        raise redis.TimeoutError("reading from Redis: timed out")

    monkeypatch.setattr(resp, "read_through", timed_out)
    with pytest.raises(redis.TimeoutError):
        clicks(store)
    monkeypatch.undo()
    assert clicks(store) == 4.0  # its replies, never read, cannot answer this read
    assert not connection_ids(settings, name) & before


def _child_reads(store: RedisFeatureStore, settings: Settings, name: str, out: multiprocessing.Queue) -> None:
    out.put((clicks(store), connection_ids(settings, name)))


def test_a_forked_child_reads_on_its_own_connection_and_leaves_its_parents_alone(
        named: tuple[RedisFeatureStore, str], settings: Settings) -> None:
    store, name = named
    assert clicks(store) == 4.0
    parents = connection_ids(settings, name)
    fork = multiprocessing.get_context("fork")
    out = fork.Queue()
    child = fork.Process(target=_child_reads, args=(store, settings, name, out))
    child.start()
    value, while_child_read = out.get(timeout=30)
    assert value == 4.0 and while_child_read - parents  # a connection of its own
    child.join(timeout=30)
    assert child.exitcode == 0
    assert clicks(store) == 4.0
    assert connection_ids(settings, name) == parents  # the child's closed with it; the parent's still open
