"""In-memory stand-ins for the trainer's I/O (gpu_trainer/base.py), for unit tests of the service's
logic only; tests/gpu_trainer/test_service_kafka.py runs the same service against Kafka and Redis."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from schemas.dead_letter import Reject
from schemas.kafka_io import ConsumedBatch

TOPIC = "samples"


class ListSource:
    """Partitions as lists; an item is a decoded record, or a Reject for an undecodable one."""

    topic = TOPIC

    def __init__(self, partitions: Mapping[int, Sequence[dict[str, Any] | Reject]]) -> None:
        self.partitions = {p: list(items) for p, items in partitions.items()}
        self.positions: dict[int, int] = {}
        self.commits: list[dict[tuple[str, int], int]] = []
        self.started_at: dict[tuple[str, int], int] | None = None
        self.closed = False

    def start(self, positions: Mapping[tuple[str, int], int]) -> None:
        self.started_at = dict(positions)
        self.seek(positions)

    def poll(self, max_records: int, timeout_s: float) -> ConsumedBatch:
        batch = ConsumedBatch([], [], {})
        for p, items in sorted(self.partitions.items()):
            while self.positions[p] < len(items) and len(batch.records) + len(batch.rejected) < max_records:
                item = items[self.positions[p]]
                if isinstance(item, Reject):
                    batch.rejected.append(Reject(item.reason, self.topic, p, self.positions[p], value=item.value))
                else:
                    batch.records.append(item)
                self.positions[p] += 1
                batch.offsets[(self.topic, p)] = self.positions[p]
        return batch

    def has_partitions(self) -> bool:
        return True

    def seek(self, positions: Mapping[tuple[str, int], int]) -> None:
        self.positions = {p: positions.get((self.topic, p), 0) for p in self.partitions}

    def commit(self, positions: Mapping[tuple[str, int], int]) -> None:
        self.commits.append(dict(positions))

    def lag(self) -> int:
        return sum(len(items) - self.positions[p] for p, items in self.partitions.items())

    def close(self) -> None:
        self.closed = True


class ListOutputs:
    def __init__(self) -> None:
        self.dead: list[Reject] = []
        self.announced: list[dict[str, Any]] = []

    def dead_letter(self, rejects: Sequence[Reject]) -> None:
        self.dead.extend(rejects)

    def dead_lettered_since(self, since_ms: int) -> set[bytes]:
        return {r.key for r in self.dead if r.key is not None}

    def announce(self, snapshot: Mapping[str, Any]) -> None:
        self.announced.append(dict(snapshot))


class MemoryPointer:
    def __init__(self, current: int | None = None) -> None:
        self.current = current

    def current_version(self) -> int | None:
        return self.current

    def set_current(self, version: int) -> None:
        self.current = version
