"""What the trainer service needs from the world, as Protocols: where samples come from, where dead
letters and snapshot announcements go, and where the current model is pointed at. The Kafka and
Redis implementations are `gpu_trainer.kafka_io` and `gpu_trainer.model_registry`; unit tests pass
in-memory ones (tests/gpu_trainer/fakes.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from schemas.dead_letter import Reject
from schemas.kafka_io import ConsumedBatch

Positions = dict[tuple[str, int], int]  # next offset to consume, per (topic, partition)


class SampleSource(Protocol):
    topic: str

    def start(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Begins consuming; each partition at `positions` (the snapshot's), the beginning where absent."""

    def poll(self, max_records: int, timeout_s: float) -> ConsumedBatch:
        """Decoded TrainingSample records until `max_records` or `timeout_s`, with rejects and next offsets."""

    def has_partitions(self) -> bool:
        """Whether partitions are assigned (idle time only counts once they are)."""

    def seek(self, positions: Mapping[tuple[str, int], int]) -> None: ...

    def commit(self, positions: Mapping[tuple[str, int], int]) -> None:
        """Informational (lag tools): the restart point is the snapshot's offsets, not the group's."""

    def lag(self) -> int: ...

    def close(self) -> None: ...


class TrainerOutputs(Protocol):
    def dead_letter(self, rejects: Sequence[Reject]) -> None:
        """Writes one DeadLetter per reject, keyed by `reject.key`."""

    def dead_lettered_since(self, since_ms: int) -> set[bytes]:
        """The keys of the trainer's dead letters written at or after `since_ms` (epoch ms)."""

    def announce(self, snapshot: Mapping[str, Any]) -> None:
        """Publishes a ModelSnapshot record (schemas/avro/ModelSnapshot.avsc)."""


class ModelPointer(Protocol):
    def current_version(self) -> int | None: ...

    def set_current(self, version: int) -> None: ...
