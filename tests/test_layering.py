"""Imports point one way: each package may import only the packages below it (README, "What it is")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALLOWED = {
    "core": set(),
    "schemas": {"core"},
    "feature_store": {"core", "schemas"},
    "flink_jobs": {"core", "schemas", "feature_store"},
    "gpu_trainer": {"core", "schemas", "feature_store"},
    "rtrec": {"core", "schemas", "feature_store", "flink_jobs", "gpu_trainer"},
}


def imported_packages(path: Path) -> set[str]:
    """Our top-level packages that a module imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
    return found & set(ALLOWED)


def test_every_import_points_down() -> None:
    wrong = [f"{path.relative_to(ROOT)} imports {sorted(other)}"
             for package, allowed in ALLOWED.items()
             for path in sorted((ROOT / package).rglob("*.py"))
             if (other := imported_packages(path) - allowed - {package})]
    assert not wrong, "\n".join(wrong)
