"""The evolution rule: a new version must read data written by every earlier version.

Concretely (Avro resolution, backward compatible): every field added since an earlier version
carries a default, no field changes to a type the old data cannot be promoted to, and the record
keeps its name. Removing a field is allowed (the reader skips it).

>>> old = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}
>>> new = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"},
...        {"name": "b", "type": "string"}]}
>>> incompatibilities(old, new)
["field 'b' added without a default"]
"""

from __future__ import annotations

from typing import Any

_PROMOTIONS = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}


def _type_key(t: Any) -> Any:
    if isinstance(t, dict):
        if t.get("type") in ("record", "enum", "fixed"):
            return (t["type"], t["name"])
        if t.get("type") == "array":
            return ("array", _type_key(t["items"]))
        if t.get("type") == "map":
            return ("map", _type_key(t["values"]))
        return t.get("type")
    if isinstance(t, list):
        return tuple(_type_key(x) for x in t)
    return t


def _readable(old: Any, new: Any) -> bool:
    if isinstance(new, list):  # a union reads each written branch with one of its own branches
        return all(any(_readable(o, n) for n in new) for o in (old if isinstance(old, list) else [old]))
    if isinstance(old, list):
        return False
    ok, nk = _type_key(old), _type_key(new)
    if isinstance(ok, str) and isinstance(nk, str):
        return nk in _PROMOTIONS.get(ok, {ok})
    if isinstance(old, dict) and isinstance(new, dict) and old.get("type") == "record":
        return old.get("name") == new.get("name") and not incompatibilities(old, new)
    if isinstance(ok, tuple) and isinstance(nk, tuple) and ok[0] == nk[0] == "array":
        return _readable(old["items"], new["items"])
    if isinstance(ok, tuple) and isinstance(nk, tuple) and ok[0] == nk[0] == "map":
        return _readable(old["values"], new["values"])
    return ok == nk


def incompatibilities(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Reasons why `new` cannot read data written with `old`; empty when compatible."""
    problems: list[str] = []
    if old.get("name") != new.get("name"):
        problems.append(f"record renamed {old.get('name')!r} -> {new.get('name')!r}")
    old_fields = {f["name"]: f for f in old["fields"]}
    for field in new["fields"]:
        before = old_fields.get(field["name"])
        if before is None:
            if "default" not in field:
                problems.append(f"field {field['name']!r} added without a default")
        elif not _readable(before["type"], field["type"]):
            problems.append(f"field {field['name']!r} changed type {before['type']!r} -> {field['type']!r}")
    return problems
