"""docker-compose.yml and the images: valid for a real Compose implementation, complete, pinned, safe
by default (loopback ports, health-gated start, restarts, AOF) and built from the lock files.

The stack itself runs in scripts/compose-smoke.sh, which needs a Docker engine (not part of this suite)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from core.settings import ServicesSettings

ROOT = Path(__file__).parents[1]
COMPOSE = ROOT / "docker-compose.yml"
NEEDED = {"kafka", "redis", "jobmanager", "taskmanager", "job-keeper", "redis-loader", "trainer", "producer"}
APP_SERVICES = ("redis-loader", "trainer", "producer")


def interpolated(text: str) -> str:
    """Compose's `${VAR:-default}` with no variable set: the defaults a user gets."""
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


@pytest.fixture(scope="module")
def services() -> dict:
    return yaml.safe_load(interpolated(COMPOSE.read_text()))["services"]


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="needs Debian's docker-compose (scripts/bootstrap.sh installs it as root)")
def test_compose_file_validates_with_docker_compose() -> None:
    result = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_service_present_and_every_image_pinned(services: dict) -> None:
    assert set(services) >= NEEDED
    for name, service in services.items():
        image = service.get("image")
        assert image, f"{name} has no image"
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest" and "/" not in tag, f"{name}: image {image} is not pinned"
        if "build" in service:
            assert (ROOT / service["build"]["dockerfile"]).is_file()
    for dockerfile in (ROOT / "scripts" / "docker").rglob("Dockerfile*"):
        stages: set[str] = set()
        for line in dockerfile.read_text().splitlines():
            if line.startswith("FROM "):
                words = line.split()
                base = words[1]
                assert base in stages or (":" in base and not base.endswith(":latest")), \
                    f"{dockerfile.relative_to(ROOT)}: {base} is not pinned"
                if len(words) == 4 and words[2].upper() == "AS":
                    stages.add(words[3])


def test_published_ports_are_loopback_and_apart_from_the_local_services(services: dict) -> None:
    local = ServicesSettings()
    taken = {local.kafka_port, local.kafka_controller_port, local.redis_port, 18081}
    published = []
    for name, service in services.items():
        for port in service.get("ports", []):
            host_ip, host_port, _ = str(port).split(":")
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond loopback by default"
            published.append(int(host_port))
    assert published and not taken & set(published), f"{sorted(taken & set(published))} collide with rtrec services"
    assert len(published) == len(set(published))


def test_kafka_advertises_a_host_listener_on_its_published_port(services: dict) -> None:
    env = services["kafka"]["environment"]
    advertised = dict(item.split("://") for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    host_port = services["kafka"]["ports"][0].split(":")[1]
    assert advertised["HOST"] == f"127.0.0.1:{host_port}"
    assert advertised["INTERNAL"] == "kafka:9092" and env["KAFKA_INTER_BROKER_LISTENER_NAME"] == "INTERNAL"
    assert "kafka-" not in " ".join(services["kafka"]["healthcheck"]["test"]), "a JVM per health check"


def test_start_is_health_gated_and_every_service_restarts(services: dict) -> None:
    for name, service in services.items():
        assert service.get("restart") == "unless-stopped", f"{name} is not restarted"
        depends = service.get("depends_on", {})
        assert isinstance(depends, dict), f"{name}: depends_on without conditions"
        for dependency, rule in depends.items():
            wanted = "service_healthy" if "healthcheck" in services[dependency] else "service_started"
            assert rule["condition"] == wanted, f"{name} -> {dependency}: {rule}"
    for name in (*APP_SERVICES, "job-keeper"):
        assert services[name]["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_state_lives_on_volumes_and_redis_keeps_an_append_only_file(services: dict) -> None:
    command = services["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])
    assert any(v.endswith(":/var/lib/kafka/data") for v in services["kafka"]["volumes"])
    assert services["kafka"]["environment"]["KAFKA_LOG_DIRS"] == "/var/lib/kafka/data"
    for name in ("jobmanager", "taskmanager", "job-keeper"):
        assert "flink-checkpoints:/data/checkpoints" in services[name]["volumes"]
    assert "chown -R flink:flink /data" in (ROOT / "scripts/docker/Dockerfile.flink").read_text()
    assert "RTREC_SERVICES__METRICS_HOST=0.0.0.0" in (ROOT / "scripts/docker/Dockerfile.app").read_text()


def test_compose_commands_exist_in_the_cli(services: dict) -> None:
    from click.testing import CliRunner

    from rtrec.cli.main import cli

    assert 'ENTRYPOINT ["python", "-m", "rtrec"]' in (ROOT / "scripts/docker/Dockerfile.app").read_text()
    for name in APP_SERVICES:
        command = services[name]["command"]
        args = [a for a in command if not a.startswith("-") and not a.isdigit()]
        result = CliRunner().invoke(cli, [*args[:2], "--help"])
        assert result.exit_code == 0, f"{name}: {command}: {result.output}"


def locked(name: str) -> dict[str, str]:
    """{package: version} of requirements/<name>.txt, after checking every pin carries its hashes."""
    pins: dict[str, str] = {}
    text = (ROOT / "requirements" / f"{name}.txt").read_text()
    for entry in re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 1)[1]):
        if not entry.strip() or entry.lstrip().startswith("#"):
            continue
        first = entry.split("\n")[0].rstrip(" \\")
        spec, _, marker = first.partition(" ; ")
        package, _, version = spec.partition("==")
        assert version, f"{name}.txt: {spec} is not pinned"
        assert "--hash=sha256:" in entry, f"{name}.txt: {spec} has no hash"
        pins[package.lower().replace("_", "-") + (f" ; {marker}" if marker else "")] = version
    return pins


def test_lock_files_pin_everything_with_hashes_and_agree() -> None:
    dev = locked("dev")
    for name in ("runtime", "app", "job"):
        for package, version in locked(name).items():
            assert dev.get(package) == version, f"{name}.txt pins {package}=={version}, dev.txt {dev.get(package)}"
        for line in (ROOT / "requirements" / f"{name}.in").read_text().splitlines():
            wanted = re.split(r"[<>=\[ ]", line.strip(), maxsplit=1)[0].lower()
            if wanted and not line.startswith("#"):
                assert any(p.split(" ")[0] == wanted for p in locked(name)), f"{wanted} of {name}.in is not locked"
    assert "torch" in locked("app") and "apache-flink" not in locked("app")
    assert "apache-flink" in locked("job") and "torch" not in locked("job")
    bootstrap = (ROOT / "scripts/bootstrap.sh").read_text()
    assert '"$ROOT/requirements/dev.txt" | sha256sum' in bootstrap and "--require-hashes" in bootstrap
    for dockerfile, lock in (("Dockerfile.app", "app.txt"), ("Dockerfile.flink", "job.txt")):
        text = (ROOT / "scripts/docker" / dockerfile).read_text()
        assert f"requirements/{lock}" in text and "--require-hashes" in text


SECURE = ROOT / "docker-compose.secure.yml"


@pytest.fixture(scope="module")
def secured_stack(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The merged, secured stack as Compose resolves it (its files made by scripts/compose-secure-init.sh)."""
    if shutil.which("docker-compose") is None or shutil.which("openssl") is None:
        pytest.skip("needs Debian's docker-compose and openssl")
    secure_dir = tmp_path_factory.mktemp("compose-secure") / "secure"
    env = {**os.environ, "RTREC_SECURE_DIR": str(secure_dir)}
    subprocess.run([str(ROOT / "scripts/compose-secure-init.sh")], env=env, check=True, capture_output=True)
    merged = subprocess.run(["docker-compose", "-f", str(COMPOSE), "-f", str(SECURE), "config"], env=env,
                            capture_output=True, text=True, cwd=ROOT)
    assert merged.returncode == 0, merged.stderr
    return {"dir": secure_dir, "config": yaml.safe_load(merged.stdout), "text": merged.stdout}


def test_secured_stack_authenticates_every_client_and_keeps_passwords_in_files(secured_stack: dict) -> None:
    d: Path = secured_stack["dir"]
    config, services = secured_stack["config"], secured_stack["config"]["services"]
    assert (d.stat().st_mode & 0o777) == 0o700 and (d / "ca.key").stat().st_mode & 0o077 == 0
    passwords = [(d / f"{who}.password").read_text().strip() for who in ("kafka-admin", "kafka-user", "redis-user")]
    assert not [p for p in passwords if p in secured_stack["text"]]  # the merged config names files only
    kafka_env = services["kafka"]["environment"]
    assert set(kafka_env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")) == {
        "INTERNAL:SASL_SSL", "HOST:SASL_SSL", "CONTROLLER:SASL_PLAINTEXT"}
    assert kafka_env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert "--port" in services["redis"]["command"] and services["redis"]["command"][
        services["redis"]["command"].index("--port") + 1] == "0"
    for name in (*APP_SERVICES, "job-keeper"):
        env = services[name]["environment"]
        assert env["RTREC_KAFKA__SECURITY__PROTOCOL"] == "SASL_SSL", name
        assert env["RTREC_KAFKA__SECURITY__PASSWORD_FILE"].startswith("/run/secrets/"), name
        assert services[name]["depends_on"]["kafka-acls"]["condition"] == "service_completed_successfully", name
    for name in APP_SERVICES:
        assert services[name]["environment"]["RTREC_REDIS__URL"].startswith("rediss://"), name
    for name in ("jobmanager", "taskmanager"):  # the connector's truststore, where the job graph names it
        assert [s["source"] if isinstance(s, dict) else s for s in services[name]["secrets"]] == ["ca"], name
    for secret in config["secrets"].values():
        assert Path(secret["file"]).is_file(), secret
    assert "user default off" in (d / "redis.acl").read_text() and passwords[2] not in (d / "redis.acl").read_text()


def test_the_acl_step_runs_an_existing_command(secured_stack: dict) -> None:
    from click.testing import CliRunner

    from rtrec.cli.main import cli

    command = secured_stack["config"]["services"]["kafka-acls"]["command"]
    result = CliRunner().invoke(cli, [*command, "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "allow User:rtrec WRITE on TOPIC prefixed 'rtrec.'" in result.output
