"""Ids hashed where a block's bytes hold them give the hashes, buckets and checks of the same ids as
Python strings (hashed by pandas), so snapshots written before keep their buckets."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpu_trainer.batch import Columns, hash_ids
from gpu_trainer.validation import check_samples
from schemas.utf8_column import Utf8Column
from tests.gpu_trainer.samples import make_samples


def random_ids(rng: np.random.Generator, n: int) -> list[str]:
    alphabets = [(0x30, 0x7A), (0x20, 0x7F), (0xA0, 0x800), (0x800, 0xD7FF), (0x10000, 0x10FFFF)]
    out = []
    for _ in range(n):
        low, high = alphabets[int(rng.integers(0, len(alphabets)))]
        out.append("".join(map(chr, rng.integers(low, high, int(rng.integers(0, 70))))))
    return out + ["", "1234567", "12345678", "123456789", "x" * 16, "é" * 4]


def test_hashes_of_utf8_bytes_equal_pandas_for_any_string() -> None:
    rng = np.random.default_rng(7)
    for _ in range(5):
        ids = random_ids(rng, 2000)
        expected = pd.util.hash_array(np.array(ids, dtype=object), hash_key="rtrec-id-hash-01")
        column = Utf8Column.from_strings(ids)
        assert hash_ids(column).tolist() == expected.tolist()
        rows = rng.permutation(len(ids))[:500]
        assert hash_ids(column[rows]).tolist() == expected[rows].tolist()


def test_columns_with_ids_as_bytes_make_the_same_batch_and_the_same_rejects() -> None:
    samples = make_samples(300, seed=8)
    samples[5] = dict(samples[5], user_id="")
    samples[9] = dict(samples[9], item_id="é" * 200)  # 200 characters, 400 bytes: allowed by characters
    samples[11] = dict(samples[11], sample_id="ß" * 300)
    strings = Columns.from_records(samples)
    as_bytes = Columns.from_records(samples)
    for name in ("sample_id", "user_id", "item_id"):
        setattr(as_bytes, name, Utf8Column.from_strings(getattr(strings, name)))
    (mask, rejects), (mask_b, rejects_b) = (check_samples(c, 20, "v1", "t", max_id_length=256)
                                            for c in (strings, as_bytes))
    assert mask.tolist() == mask_b.tolist() and np.flatnonzero(~mask).tolist() == [5, 11]
    assert [(r.reason, r.key) for r in rejects] == [(r.reason, r.key) for r in rejects_b]
    kept, kept_b = strings.select(mask), as_bytes.select(mask)
    both = Columns.concat([kept_b, kept])  # a poll of blocks beside one of plain records
    assert both.sample_id.tolist() == list(kept.sample_id) * 2
    for a, b in ((kept.to_batch(997, 1009), kept_b.to_batch(997, 1009)),
                 (Columns.concat([kept, kept]).to_batch(997, 1009), both.to_batch(997, 1009))):
        assert a.user_idx.tolist() == b.user_idx.tolist() and a.item_idx.tolist() == b.item_idx.tolist()
        assert a.sample_hash.tolist() == b.sample_hash.tolist()
