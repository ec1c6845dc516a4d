"""A secured Redis, for real: `redis-server` with TLS only (client certificates required) and an ACL
user limited to the pipeline's keys, its default user off. The store, the model registry and the CLI
connect through `RedisSettings`; wrong credentials are refused with a clear error; the password shows
up in no output."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from core.settings import FlinkSettings, RedisSettings, Settings, TrainerSettings
from feature_store.redis_store import RedisFeatureStore
from gpu_trainer.model_registry import ModelRegistry
from rtrec.cli.main import cli
from rtrec.services.credentials import make_certs
from tests.feature_store.test_redis_store import record, tile
from tests.infra import free_port

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("redis-server") is None or shutil.which("openssl") is None,
                                 reason="needs redis-server and openssl")]

PASSWORD = "pw-7f3a9c-not-in-any-output"


@dataclass
class SecuredRedis:
    port: int
    certs: Path
    password_file: Path

    def settings(self, **change: object) -> RedisSettings:
        fields: dict[str, object] = {
            "url": f"rediss://127.0.0.1:{self.port}/0", "key_prefix": "rtrec", "username": "rtrec",
            "password_file": self.password_file, "ssl_ca_file": self.certs / "ca.pem",
            "ssl_cert_file": self.certs / "client.pem", "ssl_key_file": self.certs / "client.key"}
        return RedisSettings(**(fields | change))


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredRedis]:
    home = tmp_path_factory.mktemp("secured-redis")
    make_certs(home)
    port = free_port()
    (home / "password").write_text(PASSWORD + "\n")
    conf = home / "redis.conf"
    # The password sits in a file (mode 600), not on a command line that `ps` shows.
    conf.write_text(f"""port 0
bind 127.0.0.1
tls-port {port}
tls-cert-file {home}/server.pem
tls-key-file {home}/server.key
tls-ca-cert-file {home}/ca.pem
tls-auth-clients yes
dir {home}
save ""
user default off
user rtrec on >{PASSWORD} ~rtrec:* &* +@all
""")
    conf.chmod(0o600)
    (home / "password").chmod(0o600)
    log = (home / "redis.log").open("w")
    proc = subprocess.Popen(["redis-server", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    server = SecuredRedis(port, home, home / "password")
    client = redis.Redis.from_url(server.settings().url, **server.settings().connection_kwargs())
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"secured redis-server did not start: {(home / 'redis.log').read_text()}") from None
            time.sleep(0.2)
    try:
        yield server
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def test_store_registry_and_cli_work_over_tls_as_an_acl_user(secured: SecuredRedis, tmp_path: Path) -> None:
    rs = secured.settings()
    store = RedisFeatureStore.from_settings(rs, FlinkSettings())
    assert store.write_batch([tile("u1", 60, 6000, 10, 2)]) == 1  # a tile: the progress key is under the ACL too
    assert store.get_online_features("user", ["u1"], ["60s.clicks"]).values.tolist() == [[2.0]]

    registry = ModelRegistry.from_settings(TrainerSettings(snapshot_dir=tmp_path / "snapshots"), rs)
    registry.set_current(3)
    assert registry.current_version() == 3

    env = {"RTREC_REDIS__URL": rs.url, "RTREC_REDIS__USERNAME": "rtrec",
           "RTREC_REDIS__PASSWORD_FILE": str(secured.password_file),
           "RTREC_REDIS__SSL_CA_FILE": str(secured.certs / "ca.pem"),
           "RTREC_REDIS__SSL_CERT_FILE": str(secured.certs / "client.pem"),
           "RTREC_REDIS__SSL_KEY_FILE": str(secured.certs / "client.key")}
    result = CliRunner().invoke(cli, ["features", "get", "user", "u1", "--names", "60s.clicks"], env=env)
    assert result.exit_code == 0, result.output
    assert '"60s.clicks": 2.0' in result.output and PASSWORD not in result.output
    assert '"recent": null' in result.output  # no recent engagements written for u1


def test_wrong_or_missing_credentials_are_refused_clearly(secured: SecuredRedis) -> None:
    wrong = secured.settings(password_file=None, password="not-the-password")
    with pytest.raises(redis.AuthenticationError, match="invalid username-password pair"):
        RedisFeatureStore.from_settings(wrong, FlinkSettings()).client.ping()
    anonymous = secured.settings(username=None, password_file=None)
    with pytest.raises(redis.AuthenticationError):
        RedisFeatureStore.from_settings(anonymous, FlinkSettings()).client.ping()
    without_client_cert = secured.settings(ssl_cert_file=None, ssl_key_file=None)
    with pytest.raises(redis.ConnectionError):
        RedisFeatureStore.from_settings(without_client_cert, FlinkSettings()).client.ping()
    with pytest.raises(ValueError, match="need a rediss:// URL"):
        secured.settings(url=f"redis://127.0.0.1:{secured.port}/0").connection_kwargs()

    env = {"RTREC_REDIS__URL": f"rediss://127.0.0.1:{secured.port}/0", "RTREC_REDIS__USERNAME": "rtrec",
           "RTREC_REDIS__PASSWORD": "not-the-password",
           "RTREC_REDIS__SSL_CA_FILE": str(secured.certs / "ca.pem"),
           "RTREC_REDIS__SSL_CERT_FILE": str(secured.certs / "client.pem"),
           "RTREC_REDIS__SSL_KEY_FILE": str(secured.certs / "client.key")}
    result = CliRunner().invoke(cli, ["features", "get", "user", "u1"], env=env)
    assert result.exit_code == 1 and result.exception is None or isinstance(result.exception, SystemExit)
    assert "Redis at rediss://127.0.0.1" in result.output and "refused user rtrec" in result.output
    assert "not-the-password" not in result.output


def test_a_user_outside_its_key_pattern_is_refused(secured: SecuredRedis) -> None:
    """The ACL limits the pipeline's user to its own keys (`~rtrec:*`): another prefix is refused."""
    store = RedisFeatureStore.from_settings(secured.settings(key_prefix="other"), FlinkSettings())
    with pytest.raises(redis.ResponseError, match="no permissions to access one of the keys"):
        store.write_batch([record("u1", 9000, 2)])


def test_secrets_are_not_printed_by_settings() -> None:
    s = Settings(redis=RedisSettings(url="rediss://app:url-secret@cache:6380/0", password="field-secret"))
    shown = repr(s) + str(s.model_dump()) + s.model_dump_json()
    assert "field-secret" not in shown
    assert s.redis.redacted_url() == "rediss://app:***@cache:6380/0"
