"""The loader's commits on a scripted clock: only durable offsets, one commit under way at a time, failed
ones sent again with the newest offsets, refused ones dropped, and a bound on how long they may fail."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from feature_store.commits import CommitsFailing, DurableCommits

Offsets = dict[tuple[str, int], int]


class Script:
    def __init__(self, outage_s: float = 60.0) -> None:
        self.now = 0.0
        self.sent: list[Offsets] = []
        self.refuse: KafkaError | None = None
        self.failures = 0
        self.commits = DurableCommits(self.send, commit_lag_s=2.0, outage_s=outage_s, clock=lambda: self.now,
                                      on_failure=self.failed)

    def failed(self) -> None:
        self.failures += 1

    def send(self, offsets: Offsets) -> None:
        if self.refuse is not None:
            raise KafkaException(self.refuse)
        self.sent.append(offsets)

    def answer(self, error: int | None = None) -> None:
        last = self.sent[-1]
        self.commits.on_commit(KafkaError(error) if error is not None else None,
                               [TopicPartition(t, p, o) for (t, p), o in last.items()])

    def at(self, now: float) -> list[Offsets]:
        self.now = now
        self.commits.due()
        return self.sent


def test_sends_what_is_durable_and_waits_for_the_answer_before_the_next() -> None:
    s = Script()
    s.commits.written({("t", 0): 10})
    assert s.at(1.9) == []
    s.commits.written({("t", 1): 5})
    assert s.at(2.0) == [{("t", 0): 10}]
    s.commits.written({("t", 0): 20})
    assert s.at(5.0) == [{("t", 0): 10}]  # the first is still under way
    s.answer()
    assert s.at(5.0) == [{("t", 0): 10}, {("t", 1): 5, ("t", 0): 20}]
    s.answer()
    assert not s.commits.pending


def test_a_transient_failure_is_sent_again_once_a_second_with_the_newest_offsets() -> None:
    s = Script()
    s.commits.written({("t", 0): 10, ("t", 1): 3})
    s.at(2.0)
    s.commits.written({("t", 0): 20})
    s.answer(KafkaError._WAIT_COORD)
    assert len(s.at(2.5)) == 1  # not again within the second
    assert s.at(4.5)[-1] == {("t", 0): 20, ("t", 1): 3}  # the failed offsets, newer ones winning
    s.answer()
    assert len(s.at(10.0)) == 2 and not s.commits.pending
    assert s.failures == 1  # counted (the loader's retries metric)


def test_a_commit_the_group_refused_is_dropped() -> None:
    s = Script()
    s.commits.written({("t", 0): 10})
    s.at(2.0)
    s.answer(KafkaError.UNKNOWN_MEMBER_ID)
    assert s.at(10.0) == [{("t", 0): 10}] and not s.commits.pending


def test_after_the_partitions_were_taken_a_late_failure_is_not_sent_again() -> None:
    s = Script()
    s.commits.written({("t", 0): 10})
    s.at(2.0)
    s.commits.written({("t", 0): 20})
    s.commits.forget()  # revoked or lost: whoever reads them next starts from the last commit
    s.answer(KafkaError._TRANSPORT)
    assert s.at(10.0) == [{("t", 0): 10}] and not s.commits.pending


def test_commits_failing_or_unanswered_for_longer_than_the_bound_end_it() -> None:
    s = Script(outage_s=30.0)
    s.commits.written({("t", 0): 10})
    s.at(2.0)
    s.answer(KafkaError._WAIT_COORD)
    for now in range(3, 33):
        s.at(now)
        s.answer(KafkaError._WAIT_COORD)
    with pytest.raises(CommitsFailing, match="failed for 30 s"):
        s.at(33.0)

    s = Script(outage_s=30.0)
    s.commits.written({("t", 0): 10})
    s.at(2.0)
    with pytest.raises(CommitsFailing, match="gone unanswered for 30 s"):
        s.at(32.5)


def test_a_commit_refused_at_once_counts_as_its_answer_and_a_fatal_error_ends_it() -> None:
    s = Script()
    s.refuse = KafkaError(KafkaError._TRANSPORT)
    s.commits.written({("t", 0): 10})
    s.at(2.0)
    s.refuse = None
    assert s.at(3.5) == [{("t", 0): 10}]
    s.answer(KafkaError.GROUP_AUTHORIZATION_FAILED)
    with pytest.raises(KafkaException, match="GROUP_AUTHORIZATION_FAILED"):
        s.at(4.0)
