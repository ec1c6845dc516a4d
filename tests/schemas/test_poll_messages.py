"""core.kafka.poll_messages' loop against a scripted consumer (a pure unit test of the loop: what it
asks the client for and when the collector is paused; the broker paths are the integration tests')."""

from __future__ import annotations

import gc
from typing import Any

from core.collector import cyclic_gc_paused
from core.kafka import poll_messages


class _Message:
    def __init__(self, n: int) -> None:
        self.n = n

    def error(self) -> None:
        return None


class _ScriptedConsumer:
    """Answers each consume with the next scripted list (empty once the script is done) and records
    the call with whether the collector was running during it."""

    def __init__(self, *answers: list[int]) -> None:
        self.answers = [[_Message(n) for n in answer] for answer in answers]
        self.calls: list[tuple[int, float, bool]] = []

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        self.calls.append((num_messages, timeout, gc.isenabled()))
        answer = self.answers.pop(0) if self.answers else []
        assert len(answer) <= num_messages
        return answer


def test_takes_what_is_queued_paused_and_waits_with_the_collector_running() -> None:
    consumer = _ScriptedConsumer([1, 2], [], [3], [], [])
    got = poll_messages(consumer, max_records=10, timeout_s=0.05, fill=True)  # type: ignore[arg-type]
    assert [m.n for m in got] == [1, 2, 3]
    assert gc.isenabled()
    takes = [c for c in consumer.calls if c[1] == 0]
    waits = [c for c in consumer.calls if c[1] != 0]
    assert [c[0] for c in takes[:2]] == [10, 8]  # never more than is still wanted
    assert all(not enabled for _, _, enabled in takes)
    assert waits and all(num == 1 and enabled for num, _, enabled in waits)


def test_without_fill_returns_what_arrived_without_waiting_again() -> None:
    consumer = _ScriptedConsumer([], [1], [2], [])
    got = poll_messages(consumer, max_records=10, timeout_s=5.0)  # type: ignore[arg-type]
    assert [m.n for m in got] == [1, 2]
    assert sum(1 for c in consumer.calls if c[1] != 0) == 1


def test_stops_at_max_records() -> None:
    consumer = _ScriptedConsumer([1, 2, 3])
    got = poll_messages(consumer, max_records=3, timeout_s=5.0, fill=True)  # type: ignore[arg-type]
    assert [m.n for m in got] == [1, 2, 3]
    assert len(consumer.calls) == 1


def test_a_paused_collector_stays_paused_after() -> None:
    gc.disable()
    try:
        poll_messages(_ScriptedConsumer([1]), max_records=1, timeout_s=0.0)  # type: ignore[arg-type]
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_in_the_callers_pause_waits_run_with_the_collector_and_the_pause_goes_on() -> None:
    consumer = _ScriptedConsumer([], [1], [])
    with cyclic_gc_paused() as pause:
        got = poll_messages(consumer, max_records=2, timeout_s=0.05, fill=True, pause=pause)  # type: ignore[arg-type]
        assert not gc.isenabled()  # the caller drops the messages before the collector runs again
    assert [m.n for m in got] == [1] and gc.isenabled()
    assert [enabled for _, timeout, enabled in consumer.calls if timeout != 0] == [True, True]
    assert not any(enabled for _, timeout, enabled in consumer.calls if timeout == 0)
