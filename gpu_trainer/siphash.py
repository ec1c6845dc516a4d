"""SipHash-2-4 of many byte strings at once in numpy, equal to pandas' `hash_array` of the same
strings: ids are hashed where a block's bytes hold them, with no Python string each (which cost
the trainer more than its hashes), into the same buckets as before.

>>> import pandas as pd
>>> from schemas.utf8_column import Utf8Column
>>> ids = ["u1", "", "é" * 9, "exactly8"]
>>> ours = utf8_hashes(Utf8Column.from_strings(ids), "rtrec-id-hash-01")
>>> ours.tolist() == pd.util.hash_array(np.array(ids, dtype=object), hash_key="rtrec-id-hash-01").tolist()
True
"""

from __future__ import annotations

import numpy as np

from schemas.utf8_column import Utf8Column

_ROTATIONS = {b: (np.uint64(b), np.uint64(64 - b)) for b in (13, 16, 17, 21, 32)}
_INIT = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261, 0x7465646279746573)


def _rotate(v: np.ndarray, bits: int, scratch: np.ndarray) -> None:
    left, right = _ROTATIONS[bits]
    np.left_shift(v, left, out=scratch)
    v >>= right
    v |= scratch


def _sip_rounds(v0: np.ndarray, v1: np.ndarray, v2: np.ndarray, v3: np.ndarray, scratch: np.ndarray,
                times: int) -> None:
    """SipRound `times` times, in place (uint64 arithmetic wraps, as SipHash's does)."""
    for _ in range(times):
        v0 += v1
        _rotate(v1, 13, scratch)
        v1 ^= v0
        _rotate(v0, 32, scratch)
        v2 += v3
        _rotate(v3, 16, scratch)
        v3 ^= v2
        v0 += v3
        _rotate(v3, 21, scratch)
        v3 ^= v0
        v2 += v1
        _rotate(v1, 17, scratch)
        v1 ^= v2
        _rotate(v2, 32, scratch)


_TAIL_MASKS = np.array([(1 << (8 * r)) - 1 for r in range(8)], dtype=np.uint64)


def _siphash_blocks(words_at: np.ndarray, starts: np.ndarray, lengths: np.ndarray, blocks: int,
                    key: bytes) -> np.ndarray:
    """SipHash-2-4 of strings that all take `blocks` 8-byte words (the last: their 0-7 bytes left and
    the length). `words_at[i]`: the 8 bytes from byte i on, as a little-endian word."""
    k0, k1 = (np.uint64(k) for k in np.frombuffer(key, dtype="<u8"))
    n = len(starts)
    v0, v2 = np.full(n, k0 ^ np.uint64(_INIT[0])), np.full(n, k0 ^ np.uint64(_INIT[2]))
    v1, v3 = np.full(n, k1 ^ np.uint64(_INIT[1])), np.full(n, k1 ^ np.uint64(_INIT[3]))
    scratch = np.empty(n, dtype=np.uint64)
    for j in range(blocks):
        word = words_at[starts + 8 * j]
        if j == blocks - 1:
            word &= _TAIL_MASKS[lengths - 8 * j]
            word |= (lengths.astype(np.uint64) & np.uint64(0xFF)) << np.uint64(56)
        v3 ^= word
        _sip_rounds(v0, v1, v2, v3, scratch, 2)
        v0 ^= word
    v2 ^= np.uint64(0xFF)
    _sip_rounds(v0, v1, v2, v3, scratch, 4)
    v0 ^= v1
    v0 ^= v2
    v0 ^= v3
    return v0


def utf8_hashes(column: Utf8Column, key: str) -> np.ndarray:
    """pandas' `hash_array(strings, hash_key=key)` of the column's strings: SipHash-2-4 of each one's
    UTF-8 bytes under the 16-byte `key`, then pandas' mixing of the 64 bits. Strings of as many
    8-byte words are hashed together (ids of one kind mostly have one length); each word is read where
    it lies, no copy of the strings padded to a width."""
    raw_key = key.encode("utf-8")
    if len(raw_key) != 16:
        raise ValueError(f"a SipHash key is 16 bytes, not {len(raw_key)}")
    lengths = column.byte_lengths()
    starts = column.ends - lengths
    # a word from every byte on (unaligned, overlapping), over the bytes and 8 zeros after them
    padded = np.concatenate([column.data, np.zeros(8, dtype=np.uint8)])
    words_at = np.ndarray((len(column.data) + 1,), dtype="<u8", buffer=padded, strides=(1,))
    blocks = lengths // 8 + 1
    counts = np.unique(blocks)
    if len(counts) == 1:
        out = _siphash_blocks(words_at, starts, lengths, int(counts[0]), raw_key)
    else:
        out = np.empty(len(column), dtype=np.uint64)
        for count in counts:
            rows = np.flatnonzero(blocks == count)
            out[rows] = _siphash_blocks(words_at, starts[rows], lengths[rows], int(count), raw_key)
    out ^= out >> np.uint64(30)
    out *= np.uint64(0xBF58476D1CE4E5B9)
    out ^= out >> np.uint64(27)
    out *= np.uint64(0x94D049BB133111EB)
    out ^= out >> np.uint64(31)
    return out
