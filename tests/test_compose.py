"""docker-compose.yml: valid for a real Compose implementation, complete, pinned."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
COMPOSE = ROOT / "docker-compose.yml"
NEEDED = {"kafka", "redis", "jobmanager", "taskmanager", "job-submitter", "redis-loader", "trainer", "producer"}


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="needs Debian's docker-compose (scripts/bootstrap.sh installs it as root)")
def test_compose_file_validates_with_docker_compose() -> None:
    result = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_service_present_and_every_image_pinned() -> None:
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    assert set(services) >= NEEDED
    for name, service in services.items():
        image = service.get("image")
        assert image, f"{name} has no image"
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and "/" not in tag, f"{name}: image {image} is not pinned"
        if "build" in service:
            assert (ROOT / service["build"]["dockerfile"]).is_file()
    for dockerfile in (ROOT / "scripts" / "docker").glob("Dockerfile*"):
        for line in dockerfile.read_text().splitlines():
            if line.startswith("FROM "):
                base = line.split()[1]
                assert ":" in base and not base.endswith(":latest"), f"{dockerfile.name}: {base} is not pinned"


def test_compose_commands_exist_in_the_cli() -> None:
    from click.testing import CliRunner

    from rtrec.cli.main import cli

    spec = yaml.safe_load(COMPOSE.read_text())
    for name in ("redis-loader", "trainer", "producer"):
        command = spec["services"][name]["command"]
        assert command[:3] == ["python", "-m", "rtrec"]
        args = [a for a in command[3:] if not a.startswith("-") and not a.isdigit()]
        result = CliRunner().invoke(cli, [*args[:2], "--help"])
        assert result.exit_code == 0, f"{name}: {command}: {result.output}"
