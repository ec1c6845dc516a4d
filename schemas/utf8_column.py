"""A column of strings kept as their UTF-8 bytes end to end, with each string's end offset.

A TrainingSampleBlock carries its ids this way; cutting them into Python strings cost the trainer
more than hashing them (gpu_trainer.siphash hashes them where they lie). A string is made only
where one is asked for: an item (`column[i]`), iteration, `strings()`.

>>> ids = Utf8Column.from_strings(["s1", "", "é2"])
>>> len(ids), ids[2], ids[np.array([2, 0])].strings().tolist(), ids.char_lengths().tolist()
(3, 'é2', ['é2', 's1'], [2, 0, 2])
>>> Utf8Column.concat([ids[:1], Utf8Column.from_strings(["x"])]).strings().tolist()
['s1', 'x']
>>> concat_columns([ids[:1], np.array(["x"], dtype=object)]).tolist(), concat_columns([np.array([1]), np.array([2])])
(['s1', 'x'], array([1, 2]))
>>> Utf8Column(np.frombuffer("é".encode(), np.uint8), np.array([1, 2])).utf8_error()
'a string starts inside a character'
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from schemas.bulk import take_ragged


@dataclass(frozen=True, eq=False)
class Utf8Column:
    data: np.ndarray  # uint8: every string's bytes, in order
    ends: np.ndarray  # int64: where each string ends in `data`

    @classmethod
    def from_strings(cls, values: Iterable[str]) -> Utf8Column:
        encoded = [v.encode("utf-8") for v in values]
        return cls(np.frombuffer(b"".join(encoded), dtype=np.uint8),
                   np.cumsum([len(b) for b in encoded], dtype=np.int64))

    def utf8_error(self) -> str | None:
        """Why the strings are not all UTF-8, None when they are: the whole must be, and no string may
        start inside a character."""
        if (self.data < 0x80).all():
            return None
        try:
            bytes(self.data).decode("utf-8")
        except UnicodeDecodeError as exc:
            return exc.reason
        starts = self.starts
        if ((self.data[starts[starts < len(self.data)]] & 0xC0) == 0x80).any():
            return "a string starts inside a character"
        return None

    @classmethod
    def concat(cls, parts: Sequence[Utf8Column]) -> Utf8Column:
        if not parts:
            return cls.from_strings([])
        offsets = np.cumsum([0] + [len(p.data) for p in parts[:-1]])
        return cls(np.concatenate([p.data for p in parts]),
                   np.concatenate([p.ends + offset for p, offset in zip(parts, offsets, strict=True)]).astype(np.int64))

    @property
    def starts(self) -> np.ndarray:
        return self.ends - self.byte_lengths()

    def byte_lengths(self) -> np.ndarray:
        return np.diff(self.ends, prepend=0)

    def char_lengths(self) -> np.ndarray:
        """Each string's length in characters (its bytes that do not continue a character)."""
        starting = np.concatenate([[0], np.cumsum((self.data & 0xC0) != 0x80)])
        return starting[self.ends] - starting[self.starts]

    def __len__(self) -> int:
        return len(self.ends)

    def __getitem__(self, key: int | slice | np.ndarray) -> str | Utf8Column:
        if isinstance(key, int | np.integer):
            k = range(len(self))[key]
            return bytes(self.data[int(self.ends[k - 1]) if k else 0:int(self.ends[k])]).decode("utf-8")
        rows = np.arange(len(self))[key]
        lengths = self.byte_lengths()
        return Utf8Column(take_ragged(self.data, lengths, rows), np.cumsum(lengths[rows], dtype=np.int64))

    def __iter__(self) -> Iterator[str]:
        return iter(self.strings())

    def tolist(self) -> list[str]:
        return self.strings().tolist()

    def strings(self) -> np.ndarray:
        """The strings as an object array."""
        text, ends = bytes(self.data).decode("utf-8"), self.ends.tolist()
        if len(text) != len(self.data):  # not ASCII: offsets in bytes are not offsets in characters
            raw = bytes(self.data)
            cut = [raw[a:b].decode("utf-8") for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        else:
            cut = [text[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
        out = np.empty(len(cut), dtype=object)
        out[:] = cut
        return out


def concat_columns(parts: Sequence[np.ndarray | Utf8Column]) -> np.ndarray | Utf8Column:
    """Columns end to end: numpy arrays as `np.concatenate` makes them; with a Utf8Column among them
    (a poll's blocks beside plain records), one Utf8Column, the strings encoded to join it."""
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts)
    return Utf8Column.concat([p if isinstance(p, Utf8Column) else Utf8Column.from_strings(p) for p in parts])
