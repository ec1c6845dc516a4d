"""The loader's offset commits: made once the records are durable in Redis, and never waited for.

Why not a synchronous commit retried until it succeeds: while Kafka is down, such a commit blocks the
loop, and the loop is what serves the consumer group's rebalance callbacks. When the group's session
runs out, librdkafka waits for the loop to hand the lost partitions back, while the loop waits for a
commit that needs the group. Here a commit is sent asynchronously, one at a time, and its result
arrives through `on_commit` while the loop goes on polling.

A commit that fails transiently is sent again, with the newest offsets, at most once a second. A
commit the group refused (the partitions moved to another member) is dropped: whoever reads them
next starts from the last commit, and the loader writes the same windows again, which changes
nothing. Commits that keep failing, or one that never answers, for longer than `outage_s` end the
loader (LoaderError) instead of letting it run on without a word.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from core.kafka import is_transient

log = logging.getLogger("rtrec.loader")
# A commit refused because the group took the partitions away (this loader's session ran out while
# Kafka was down, or a rebalance): whoever reads them next starts from the last commit.
_GROUP_MOVED_ON = {KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS,
                   KafkaError.FENCED_INSTANCE_ID, KafkaError._ASSIGNMENT_LOST}
_RESEND_EVERY_S = 1.0

Offsets = dict[tuple[str, int], int]


def refused_by_group(error: KafkaError) -> bool:
    """Whether a commit failed because the group moved the partitions on (said in the log): nothing to
    send again, their records are read again from the last commit."""
    if error.code() not in _GROUP_MOVED_ON:
        return False
    log.warning("offsets not committed, the group has reassigned the partitions (%s): their records are read "
                "again from the last commit", error.str())
    return True


class CommitsFailing(RuntimeError):
    """Offsets could not be committed for longer than the loader's outage bound."""


class DurableCommits:
    """Offsets written to Redis, committed `commit_lag_s` later (`due`), asynchronously.

    >>> now = [0.0]
    >>> sent = []
    >>> commits = DurableCommits(lambda offsets: sent.append(offsets), commit_lag_s=2.0, outage_s=60.0,
    ...                          clock=lambda: now[0])
    >>> commits.written({("t", 0): 10}); now[0] = 1.0; commits.written({("t", 0): 20}); commits.due(); sent
    []
    >>> now[0] = 2.5; commits.due(); sent  # the first batch is durable, the second not yet
    [{('t', 0): 10}]
    >>> commits.on_commit(None, [TopicPartition("t", 0, 10)]); now[0] = 3.5; commits.due(); sent[-1]
    {('t', 0): 20}
    """

    def __init__(self, send: Callable[[Offsets], None], commit_lag_s: float, outage_s: float,
                 clock: Callable[[], float] = time.monotonic, on_failure: Callable[[], None] | None = None) -> None:
        self._send = send
        self._on_failure = on_failure
        self.commit_lag_s = commit_lag_s
        self.outage_s = outage_s
        self._clock = clock
        self._pending: deque[tuple[float, Offsets]] = deque()  # (written at, next offsets)
        self._unsent: Offsets = {}  # durable, not yet committed (or to be sent again)
        self._in_flight_since: float | None = None
        self._failing_since: float | None = None
        self._last_sent = float("-inf")
        self._fatal: KafkaError | None = None
        self._epoch = self._sent_in_epoch = 0  # `forget` starts a new epoch: older results no longer matter

    @property
    def pending(self) -> bool:
        return bool(self._pending or self._unsent)

    def durable_in(self) -> float:
        """Seconds until everything written so far is durable."""
        return max(0.0, self.commit_lag_s - (self._clock() - self._pending[-1][0])) if self._pending else 0.0

    def written(self, offsets: Offsets) -> None:
        """The records up to `offsets` (next to read, per partition) are in Redis."""
        self._pending.append((self._clock(), offsets))

    def due(self) -> None:
        """Sends what has become durable, unless a commit is still under way; raises CommitsFailing when
        commits have failed, or one has gone unanswered, for longer than `outage_s`."""
        now = self._clock()
        if self._fatal is not None:
            raise KafkaException(self._fatal)
        for since, what in ((self._failing_since, "failed"), (self._in_flight_since, "gone unanswered")):
            if since is not None and now - since > self.outage_s:
                raise CommitsFailing(f"offset commits have {what} for {self.outage_s:.0f} s")
        while self._pending and now - self._pending[0][0] >= self.commit_lag_s:
            self._unsent.update(self._pending.popleft()[1])
        resending = self._failing_since is not None
        if not self._unsent or self._in_flight_since is not None or (resending
                                                                     and now - self._last_sent < _RESEND_EVERY_S):
            return
        offsets, self._unsent = self._unsent, {}
        self._in_flight_since = self._last_sent = now
        self._sent_in_epoch = self._epoch
        try:
            self._send(offsets)
        except KafkaException as exc:  # refused at once (no result will come through on_commit)
            self._in_flight_since = None
            self._result(exc.args[0], offsets)

    def on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The consumer's `on_commit` callback: the result of the commit under way."""
        self._in_flight_since = None
        if self._sent_in_epoch != self._epoch:
            return
        failed = next((tp.error for tp in partitions if tp.error is not None), None)
        self._result(error or failed, {(tp.topic, tp.partition): tp.offset for tp in partitions})

    def _result(self, error: KafkaError | None, offsets: Offsets) -> None:
        if error is None or error.code() == KafkaError._NO_OFFSET or refused_by_group(error):
            self._failing_since = None
        elif is_transient(error):
            if self._failing_since is None:
                self._failing_since = self._clock()
            log.warning("committing offsets failed (%s); sending them again", error.str())
            if self._on_failure is not None:
                self._on_failure()
            self._unsent = {**offsets, **self._unsent}  # newer offsets of the same partition win
        else:
            self._fatal = error

    def forget(self) -> None:
        """The partitions were taken away, or the loader goes back to the committed offsets: what was not
        committed yet is read again from the last commit (and writing it again changes nothing)."""
        self._pending.clear()
        self._unsent.clear()
        self._failing_since = None
        self._epoch += 1

    def commit_all_now(self, commit: Callable[[Offsets], Any]) -> None:
        """A clean stop: everything written, committed synchronously with `commit`."""
        while self._pending:
            self._unsent.update(self._pending.popleft()[1])
        if self._unsent:
            offsets, self._unsent = self._unsent, {}
            commit(offsets)
