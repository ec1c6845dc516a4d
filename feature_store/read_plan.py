"""What a read of a list of feature names turns into, worked out once per list: the fields of one
entity's HMGET, where each value sits in its reply, and where each name's value comes from, plain
fields and the tiled horizons' rings alike (merged by `feature_store.tile_merge`)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from feature_store.keys import (
    SLOT_BYTES,
    SLOT_VALUES,
    TILE_BYTES,
    VALUE_BYTES,
    ring_field,
    ring_parts,
    split_feature_name,
    values_field,
)
from feature_store.resp import RowLayout
from feature_store.tile_merge import DISTINCT, MERGED_VALUES, merge_rings

TILE_FLOATS = TILE_BYTES // VALUE_BYTES
SLOT_FLOATS = SLOT_BYTES // VALUE_BYTES


@dataclass(frozen=True)
class ReadPlan:
    """What one list of feature names turns into on the wire, worked out once per list."""

    width: int  # fields per entity: one window's values per plain horizon, a ring's fields per tiled one
    plain_width: int  # the fields before the rings
    tiled: list[tuple[int, int]]  # (horizon, tiles per ring) per ring read
    # where each name's value comes from, as numpy indices: the names of plain horizons (plain_out) from
    # the windows' floats [entity, plain horizon * SLOT_FLOATS] (plain_in) with their window end
    # (plain_end_in), those no window keeps (plain_unknown_out) NaN; those of rings (tiled_out) from the
    # merged rings [entity, ring * len(MERGED_VALUES)] (tiled_in) of ring tiled_ring; a name no tile
    # keeps (unknown_out) reads NaN with its ring's window end
    plain_out: np.ndarray
    plain_in: np.ndarray
    plain_end_in: np.ndarray
    plain_unknown_out: np.ndarray
    tiled_out: np.ndarray
    tiled_in: np.ndarray
    tiled_ring: np.ndarray
    unknown_out: np.ndarray
    unknown_ring: np.ndarray
    distinct_rings: list[int]  # the rings whose distinct counterparts are read (their sketches too)
    ring_floats: list[int]  # where each ring starts in a read's rings, and their end
    fields: list[str]
    head: bytes  # RESP before the key
    tail: bytes  # RESP after the key: the fields
    layout: RowLayout  # an entity's reply when every field is there
    plain_bytes: np.ndarray  # in that reply, the bytes of the plain horizons' windows, in order
    ring_bytes: list[tuple[int, int, int]]  # and each ring field's offset, length and offset in the rings


@functools.lru_cache(maxsize=64)
def read_plan(names: tuple[str, ...], tiles_s: tuple[tuple[int, int], ...]) -> ReadPlan:
    tile_of = dict(tiles_s)
    parsed = [split_feature_name(n) for n in names]
    plain_horizons = sorted({h for h, _ in parsed if h not in tile_of})
    tiled = sorted({h for h, _ in parsed if h in tile_of})
    fields = [values_field(h) for h in plain_horizons]
    plain_width = len(fields)
    rings = [(h, h // tile_of[h]) for h in tiled]
    ring_fields = [(ring_field(h, ring, j), tiles * TILE_BYTES) for h, ring in rings
                   for j, tiles in enumerate(ring_parts(ring))]
    fields += [field for field, _ in ring_fields]
    ring_field_bytes = [size for _, size in ring_fields]
    plain_cols, plain_unknown, tiled_cols, unknown_cols = [], [], [], []
    for column, (horizon, feature) in enumerate(parsed):
        if horizon not in tile_of:
            end = plain_horizons.index(horizon) * SLOT_FLOATS
            known = feature in SLOT_VALUES
            plain_cols.append((column, end + 1 + SLOT_VALUES.index(feature) if known else end, end))
            if not known:
                plain_unknown.append(column)
        elif feature in MERGED_VALUES:
            r = tiled.index(horizon)
            tiled_cols.append((column, r * len(MERGED_VALUES) + MERGED_VALUES.index(feature), r))
        else:
            unknown_cols.append((column, tiled.index(horizon)))
    tail = b"".join(b"$%d\r\n%s\r\n" % (len(f), f) for f in (f.encode() for f in fields))
    layout = RowLayout.of([SLOT_BYTES] * plain_width + ring_field_bytes)
    plain_bytes = (np.array(layout.value_at[:plain_width], dtype=np.intp)[:, None]
                   + np.arange(SLOT_BYTES)).reshape(-1)
    ring_bytes = list(zip(layout.value_at[plain_width:], ring_field_bytes,
                          np.cumsum([0, *ring_field_bytes])[:-1].tolist(), strict=True))
    plain_out, plain_in, plain_end_in = np.array(plain_cols, dtype=np.intp).reshape(-1, 3).T
    tiled_out, tiled_in, tiled_ring = np.array(tiled_cols, dtype=np.intp).reshape(-1, 3).T
    unknown_out, unknown_ring = np.array(unknown_cols, dtype=np.intp).reshape(-1, 2).T
    return ReadPlan(
        width=len(fields), plain_width=plain_width, tiled=rings,
        plain_out=plain_out, plain_in=plain_in, plain_end_in=plain_end_in,
        plain_unknown_out=np.array(plain_unknown, dtype=np.intp),
        tiled_out=tiled_out, tiled_in=tiled_in, tiled_ring=tiled_ring,
        unknown_out=unknown_out, unknown_ring=unknown_ring,
        distinct_rings=sorted({tiled.index(h) for h, feature in parsed if h in tile_of and feature == DISTINCT}),
        ring_floats=[0, *np.cumsum([ring * TILE_FLOATS for _, ring in rings]).tolist()], fields=fields,
        head=b"*%d\r\n$5\r\nHMGET\r\n" % (len(fields) + 2), tail=tail, layout=layout, plain_bytes=plain_bytes,
        ring_bytes=ring_bytes)


def merged_rings(rings: np.ndarray, plan: ReadPlan, as_of_ms: list[float | None]) -> tuple[np.ndarray, np.ndarray]:
    """`merge_rings` of a read's rings [entity, floats of every ring]: in one pass when the rings are
    alike (the default horizons: 20 tiles each), else ring by ring."""
    n, horizons, lengths = len(rings), [h for h, _ in plan.tiled], {ring for _, ring in plan.tiled}
    if len(lengths) == 1:
        return merge_rings(rings.reshape(n, len(horizons), lengths.pop(), TILE_FLOATS), horizons, as_of_ms)
    parts = [merge_rings(ring_tiles(rings, plan, r)[:, None], [horizon], [as_of_ms[r]])
             for r, (horizon, _) in enumerate(plan.tiled)]
    return np.concatenate([m for m, _ in parts], axis=1), np.concatenate([e for _, e in parts], axis=1)


def ring_tiles(rings: np.ndarray, plan: ReadPlan, r: int) -> np.ndarray:
    """Ring r of a read's rings [entity, floats of every ring], as [entity, tile, TILE_FLOATS] (a view)."""
    return rings[:, plan.ring_floats[r]:plan.ring_floats[r + 1]].reshape(len(rings), plan.tiled[r][1], TILE_FLOATS)
