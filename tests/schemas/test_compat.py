"""The evolution rule, checked for every schema against each of its frozen earlier versions."""

from __future__ import annotations

import io

import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from schemas.compat import incompatibilities
from schemas.registry import current_schemas, history


@pytest.mark.parametrize("name", sorted(current_schemas()))
def test_current_schema_reads_every_earlier_version(name: str) -> None:
    versions = history(name)
    assert versions, f"{name} has no frozen version under schemas/history/{name}/ (copy it there as v1.avsc)"
    current = current_schemas()[name]
    for old in versions:
        assert incompatibilities(old.raw, current.raw) == [], f"{name} breaks {old.version}"


@pytest.mark.parametrize("name", sorted(current_schemas()))
def test_newest_frozen_version_matches_or_precedes_current(name: str) -> None:
    """Changing a schema means freezing the previous text as the next vN.avsc first."""
    newest = history(name)[-1]
    current = current_schemas()[name]
    if newest.fingerprint != current.fingerprint:
        assert incompatibilities(newest.raw, current.raw) == []


BASE = {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"},
                                                  {"name": "b", "type": ["null", "string"], "default": None}]}


@pytest.mark.parametrize(("fields", "problem"), [
    ([{"name": "a", "type": "int"}, {"name": "c", "type": "long"}], "field 'c' added without a default"),
    ([{"name": "a", "type": "string"}], "field 'a' changed type"),
    ([{"name": "a", "type": "int"}, {"name": "b", "type": "string"}], "field 'b' changed type"),
])
def test_breaking_changes_are_named(fields: list, problem: str) -> None:
    assert any(problem in p for p in incompatibilities(BASE, dict(BASE, fields=fields)))


@pytest.mark.parametrize("fields", [
    [{"name": "a", "type": "long"}, {"name": "b", "type": ["null", "string"], "default": None}],
    [{"name": "a", "type": "int"}],
    [*BASE["fields"], {"name": "c", "type": "double", "default": 0.0}],
])
def test_compatible_changes_pass_and_really_resolve(fields: list) -> None:
    new = dict(BASE, fields=fields)
    assert incompatibilities(BASE, new) == []
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(BASE), {"a": 5, "b": "x"})
    buf.seek(0)
    assert schemaless_reader(buf, parse_schema(BASE), parse_schema(new))["a"] == 5
