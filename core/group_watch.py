"""Notices a consumer that its group left behind without a word.

After a broker restart, librdkafka now and then loses track of the group coordinator: the consumer's
session runs out, its partitions are taken away, and it never joins the group again. No error comes
out of `poll`; the consumer simply never gets partitions back (librdkafka issues 2944, 3082, 3396
describe such consumers, and the Redis loader met one here after a 30 s outage of its only broker).
Only the coordinator knows the group's members, so this asks it, and only for a consumer that has had
no partitions for a while: a consumer with partitions is in its group by definition. Its verdict counts
when two answers in a row, `every_s` apart, say so: a broker just restarted loads the group empty, and
a consumer that is still finding its coordinator then is not lost yet.

A consumer may rightly hold no partitions (more consumers than partitions): the coordinator then lists
it as a member of the settled group, and nothing is done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, ConsumerGroupState, KafkaException
from confluent_kafka.admin import AdminClient

log = logging.getLogger("rtrec.kafka")
_SETTLED = (ConsumerGroupState.STABLE, ConsumerGroupState.EMPTY)


@dataclass(frozen=True)
class GroupView:
    """What the group coordinator says: the group's state and its members' ids."""

    state: ConsumerGroupState
    members: frozenset[str]


def left_behind(view: GroupView | None, member_id: str | None) -> bool:
    """Whether the group settled without the consumer `member_id` (None or "": it holds no member id).
    A group still rebalancing may yet take it in; no view (the coordinator did not answer) says nothing.

    >>> stable = GroupView(ConsumerGroupState.STABLE, frozenset({"rtrec-1"}))
    >>> left_behind(stable, "rtrec-1"), left_behind(stable, "rtrec-2"), left_behind(stable, None)
    (False, True, True)
    >>> left_behind(GroupView(ConsumerGroupState.EMPTY, frozenset()), "rtrec-1")
    True
    >>> left_behind(GroupView(ConsumerGroupState.PREPARING_REBALANCING, frozenset()), "rtrec-1")
    False
    >>> left_behind(None, "rtrec-1")
    False
    """
    return view is not None and view.state in _SETTLED and (not member_id or member_id not in view.members)


def describe_group(admin: AdminClient, group_id: str, timeout_s: float = 10.0) -> GroupView | None:
    """The coordinator's view of the group, or None when it cannot be had now (a broker down)."""
    try:
        found = admin.describe_consumer_groups([group_id], request_timeout=timeout_s)[group_id].result(timeout_s)
    except (KafkaException, TimeoutError) as exc:  # the future's own wait may end before the request's
        log.debug("describing group %s failed: %s", group_id, exc)
        return None
    return GroupView(found.state, frozenset(m.member_id for m in found.members))


class GroupWatch:
    """`left_behind(consumer)`: true once the consumer has had no partitions for `after_s` and the
    coordinator, asked every `every_s`, has twice in a row settled the group without it."""

    def __init__(self, bootstrap: str, group_id: str, after_s: float, every_s: float = 10.0,
                 security: Mapping[str, str] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.group_id, self.after_s, self.every_s = group_id, after_s, every_s
        self._admin_config = {"bootstrap.servers": bootstrap, **(security or {})}
        self._admin: AdminClient | None = None
        self._clock = clock
        self._unassigned_since: float | None = None
        self._asked_at = float("-inf")
        self._answers_without_it = 0

    def left_behind(self, consumer: Consumer, polled_records: bool = False) -> bool:
        """`polled_records`: the consumer's last poll brought records, so it has partitions (asking it
        for its assignment took 2 % of the trainer's time over a backlog)."""
        now = self._clock()
        if polled_records or consumer.assignment():
            self._unassigned_since, self._answers_without_it = None, 0
            return False
        if self._unassigned_since is None:
            self._unassigned_since = now
        if now - self._unassigned_since < self.after_s or now - self._asked_at < self.every_s:
            return False
        self._asked_at = now
        if self._admin is None:
            self._admin = AdminClient(self._admin_config)
        without_it = left_behind(describe_group(self._admin, self.group_id), consumer.memberid())
        self._answers_without_it = self._answers_without_it + 1 if without_it else 0
        return self._answers_without_it >= 2

    def unassigned_for(self) -> float:
        return 0.0 if self._unassigned_since is None else self._clock() - self._unassigned_since

    def restart(self) -> None:
        """A new consumer took the old one's place: its time without partitions starts now."""
        self._unassigned_since, self._asked_at, self._answers_without_it = None, float("-inf"), 0
