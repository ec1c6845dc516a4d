r"""Redis key layout (pure).

One hash per entity: `{prefix}:f:{entity_type}:{entity_id}`. A feature is named `{horizon}s.{feature}`
(e.g. `60s.clicks`). A horizon's window is one field, `{horizon}s.values`: the end (epoch ms) of the
window, then the SLOT_VALUES in that order, each 8 bytes, a little-endian IEEE float64 (window ends
in ms are exact). One field per window, not one per feature: Redis took about 11 µs of its one
thread to set a pair's 11 fields and 5 µs to set them as one (README, "End to end, into Redis").
A window is only ever replaced whole, by one that ends later (newest wins). `rtrec features get`
prints the features decoded.

>>> entity_key("rtrec", "user", "u1")
'rtrec:f:user:u1'
>>> field_name(60, "ctr"), values_field(60), SLOT_BYTES
('60s.ctr', '60s.values', 88)
>>> split_feature_name("600s.clicks")
(600, 'clicks')

A user's hash also holds the user's recent engagements, as of the end of the window they were written
for: `0s.__we` (that end, 8 bytes like the others) and `recent`, JSON
`{"items": [...], "types": [...], "times_ms": [...]}`, newest first.

A longer horizon whose window hops (the feature job's `flink.horizon_slides_s`: 3 s for 60 s, 30 s
for 600 s) is kept as tiles, a tumbling window of its hop each, instead of one window: a ring of
n = horizon / hop tiles, kept TILES_PER_FIELD tiles to a hash field, `{horizon}s.t{n}.{j}` holding
tiles j * TILES_PER_FIELD onwards (the last field maybe fewer). A tile is its window end, then
TILE_VALUES, each 8 bytes like the others; a tile whose window end is 0 was never written. Each
position is replaced only by a tile that ends later (newest wins). The first tile written into an
entity's ring writes all of its fields (zeros where no tile is), so that a read of the ring finds
every field and is cut into columns without a parse per reply. Why parts of a ring: Redis took 14-19
µs of its thread to rewrite a 1,440-byte ring for each tile, 11-12 µs to rewrite a part of five, and
8-12 µs to set a field of one tile, whose 41 fields per user read doubled its time per read (README,
"A tile rewrites part of its ring"). A ring of another length (flink.horizon_slides_s changed) is
other fields. The hash `{prefix}:progress` holds per horizon (`progress_field`) the newest tile end
written and the ring's length, two float64s: a read adds up each entity's tiles ending in
(progress - horizon, progress], the hopping window that ends at the store's progress in event time,
and refuses a ring of another length.

>>> ring_field(600, 20, 3), ring_parts(20), ring_parts(7), progress_key("rtrec"), progress_field(600)
('600s.t20.3', [5, 5, 5, 5], [5, 2], 'rtrec:progress', '600s.tiles')

Distinct counterparts do not add up across tiles, so a user's or item's tile also keeps its sketch: the
field `{horizon}s.sketch.{k}` for ring position k holds the tile's window end (8 bytes, as in the ring)
and then its counterpart_hashes, little-endian int64s. It is written with the tile at that position
and counts only while its window end is the ring's there.

>>> sketch_field(60, 7)
'60s.sketch.7'

A user-item pair's id joins the two with `|`, each with a backslash or `|` in it escaped by a backslash, so two
different pairs never share a key (before, user `uA|iB` + item `C` and user `uA` + item `iB|C` did).
Ids without those characters look as they always did:

>>> pair_id("u1", "i9"), pair_id("uA|iB", "C"), pair_id("uA", "iB|C")
('u1|i9', 'uA\\|iB|C', 'uA|iB\\|C')
"""

from __future__ import annotations

# The horizon of a user's recent-engagements record, and the field holding the list.
RECENT_HORIZON_S = 0
RECENT_FIELD = "recent"
# What a tile keeps after its window end: the sums a horizon adds up (a ratio is merged from its
# parts), and distinct_counterparts, which a reader takes the most of (distinct ids do not add up).
TILE_VALUES = ("impressions", "clicks", "likes", "carts", "orders", "dwell_sum_ms", "dwell_count",
               "distinct_counterparts")
# What a window's field keeps after its window end: the FeatureRecord's values (those of its schema
# that are neither the slot's key, the recent lists nor the tiles' sketch).
SLOT_VALUES = ("impressions", "clicks", "likes", "carts", "orders", "ctr", "dwell_sum_ms", "dwell_mean_ms",
               "distinct_counterparts", "dwell_count")
VALUE_BYTES = 8  # every value is a little-endian float64
TILE_BYTES = VALUE_BYTES * (1 + len(TILE_VALUES))
TILES_PER_FIELD = 5  # of a ring (a part of the ring is rewritten per tile, and read per field)
SLOT_BYTES = VALUE_BYTES * (1 + len(SLOT_VALUES))


def entity_key(prefix: str, entity_type: str, entity_id: str) -> str:
    return entity_key_prefix(prefix, entity_type) + entity_id


def entity_key_prefix(prefix: str, entity_type: str) -> str:
    """Every key of one entity type starts with this."""
    return f"{prefix}:f:{entity_type}:"


def field_name(horizon_s: int, feature: str) -> str:
    return f"{horizon_s}s.{feature}"


def window_end_field(horizon_s: int) -> str:
    """The window end beside a user's recent engagements (horizon 0)."""
    return f"{horizon_s}s.__we"


def values_field(horizon_s: int) -> str:
    return f"{horizon_s}s.values"


def ring_field(horizon_s: int, ring: int, part: int) -> str:
    """Part `part` of a ring of `ring` tiles: its tiles part * TILES_PER_FIELD onwards."""
    return f"{ring_field_prefix(horizon_s, ring)}{part}"


def ring_field_prefix(horizon_s: int, ring: int) -> str:
    return f"{horizon_s}s.t{ring}."


def ring_parts(ring: int) -> list[int]:
    """The tiles in each of a ring's fields, in order."""
    whole, rest = divmod(ring, TILES_PER_FIELD)
    return [TILES_PER_FIELD] * whole + [rest] * bool(rest)


def progress_field(horizon_s: int) -> str:
    """The progress hash's field of a tiled horizon."""
    return f"{horizon_s}s.tiles"


def sketch_field(horizon_s: int, position: int) -> str:
    return f"{sketch_field_prefix(horizon_s)}{position}"


def sketch_field_prefix(horizon_s: int) -> str:
    return f"{horizon_s}s.sketch."


def progress_key(prefix: str) -> str:
    return f"{prefix}:progress"


def split_feature_name(name: str) -> tuple[int, str]:
    """`'60s.ctr'` -> `(60, 'ctr')`; ValueError for anything else."""
    horizon, sep, feature = name.partition(".")
    if not sep or not horizon.endswith("s") or not horizon[:-1].isdigit() or not feature:
        raise ValueError(f"feature name {name!r} is not '<horizon>s.<feature>', e.g. '60s.clicks'")
    return int(horizon[:-1]), feature


def _escape(entity_id: str) -> str:
    return entity_id.replace("\\", "\\\\").replace("|", "\\|")


def pair_id(user_id: str, item_id: str) -> str:
    """The entity id of a user-item pair (feature job and readers alike)."""
    return f"{_escape(user_id)}|{_escape(item_id)}"

