"""A rejected record, typed, and the one place that turns it into a DeadLetter.

Every stage that cannot use a record (replay, loader, trainer) describes it as a `Reject` and
dead-letters it with `dead_letter(...)`, so each DeadLetter carries the same fields the same way.

>>> r = Reject("sample s9: label 2.0 is not 0 or 1", topic="rtrec.samples")
>>> record = dead_letter("trainer", r, detected_at=1700000000000)
>>> record["source_topic"], record["source_partition"], record["reason"]
('rtrec.samples', None, 'sample s9: label 2.0 is not 0 or 1')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Reject:
    """Why a record was refused and where it came from, as far as that is known."""

    reason: str
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    key: bytes | None = None  # what identifies the record to whoever reads the dead letters again
    value: bytes | None = None  # the raw record, where it is worth keeping


def dead_letter(stage: str, reject: Reject, detected_at: int) -> dict[str, Any]:
    """The DeadLetter record (schemas/avro/DeadLetter.avsc) for one reject."""
    return {"stage": stage, "reason": reject.reason, "source_topic": reject.topic,
            "source_partition": reject.partition, "source_offset": reject.offset, "key": reject.key,
            "value": reject.value, "detected_at": detected_at}
