"""`rtrec services up --secure`, for real: Kafka whose only client listener is SASL_SSL (SCRAM users
written at format time, the StandardAuthorizer, ACLs for the pipeline's user) and Redis on TLS only
with one ACL user. The whole loop (events -> feature job -> features and samples topics -> loader ->
Redis -> trainer -> promoted snapshot) runs against them through the settings file the command
writes; unauthenticated, wrong-password and out-of-bounds clients are refused; a user without the
WRITE ACL on the features topic makes the job fail with a message naming that ACL; and no password
appears in any output, log, checkpoint, snapshot or in the Flink REST API's view of the job."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from pydantic import SecretStr

from core.settings import KafkaSecuritySettings, ServicesSettings, Settings, load_settings
from flink_jobs.monitor import RunningJob
from rtrec.cli.main import cli
from rtrec.services import manager
from rtrec.services.credentials import LocalCredentials
from rtrec.services.flink_cluster import FlinkCluster
from rtrec.services.kafka_broker import pipeline_acls
from tests.faults.runs import ROOT, env_of
from tests.flink_jobs.harness import create_topics, event, job_settings, produce, wait_for
from tests.infra import free_port

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(any(shutil.which(b) is None for b in ("java", "openssl", "redis-server")),
                                 reason="needs java, openssl and redis-server")]

NO_WRITE_USER = "rtrec-no-write"
NO_WRITE_PASSWORD = "no-write-pw-93b1-not-in-any-output"
# Files that hold a password by design (the credentials themselves, the servers' mode-600 configs)
HOLDS_SECRETS = re.compile(r"(\.password|server\.properties|redis\.conf|\.key|keystore\.pem)$")


@dataclass
class Secured:
    cfg: ServicesSettings
    credentials: LocalCredentials
    up_output: str

    def passwords(self) -> list[str]:
        return [self.credentials.password(who) for who in ("kafka-admin", "kafka-user", "redis-user")]

    def client(self, **change: object) -> Settings:
        """The pipeline's settings, read from the file `services up --secure` wrote."""
        return load_settings(self.credentials.client_toml, **change)

    def admin(self) -> AdminClient:
        from rtrec.services.kafka_broker import KafkaBroker

        return AdminClient({"bootstrap.servers": f"127.0.0.1:{self.cfg.kafka_port}",
                            **KafkaBroker(self.cfg).admin_config()})


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    state = tmp_path_factory.mktemp("secured-services")
    env = {"RTREC_SERVICES__STATE_DIR": str(state),
           "RTREC_SERVICES__CACHE_DIR": str(load_settings().services.cache_dir),  # the jars already fetched
           "RTREC_SERVICES__KAFKA_PORT": str(free_port()), "RTREC_SERVICES__KAFKA_CONTROLLER_PORT": str(free_port()),
           "RTREC_SERVICES__REDIS_PORT": str(free_port())}
    result = CliRunner().invoke(cli, ["services", "up", "--secure"], env=env)
    cfg = load_settings(**{"services": {k.removeprefix("RTREC_SERVICES__").lower(): v for k, v in env.items()}
                           | {"secure": {"enabled": True}}}).services
    try:
        assert result.exit_code == 0, result.output
        yield Secured(cfg, LocalCredentials.of(cfg), result.output)
    finally:
        manager.down(cfg)


def files_with(root: Path, secrets: list[str]) -> list[str]:
    """Every file under `root` (but those that hold a password by design) that contains one of `secrets`."""
    return [str(p) for p in root.rglob("*") if p.is_file() and not HOLDS_SECRETS.search(p.name)
            and any(s.encode() in p.read_bytes() for s in secrets)]


def test_up_secure_writes_client_settings_and_refuses_other_clients(secured: Secured) -> None:
    out = secured.up_output
    assert "SASL_SSL, SCRAM-SHA-512; ACLs for User:rtrec" in out and "TLS, user rtrec" in out, out
    assert f"RTREC_CONFIG={secured.credentials.client_toml}" in out
    assert not [p for p in secured.passwords() if p in out + secured.credentials.client_toml.read_text()
                + secured.credentials.client_env.read_text()]
    for who in ("kafka-admin", "kafka-user", "redis-user"):
        assert secured.credentials.password_file(who).stat().st_mode & 0o077 == 0
    s = secured.client()
    k = s.kafka
    # the pipeline's user reaches Kafka, and its ACLs are exactly the documented ones
    AdminClient({"bootstrap.servers": k.bootstrap_servers, **k.security.librdkafka()}).list_topics(timeout=20)
    admin = secured.admin()  # held: the future fails when its client is collected
    described = admin.describe_acls(AclBindingFilter(
        ResourceType.ANY, None, ResourcePatternType.ANY, "User:rtrec", None, AclOperation.ANY,
        AclPermissionType.ANY), request_timeout=20).result()
    assert sorted(map(str, described)) == sorted(map(str, pipeline_acls(secured.cfg)))
    # a client without TLS and SASL, and one with a wrong password, are refused
    with pytest.raises(KafkaException):
        AdminClient({"bootstrap.servers": k.bootstrap_servers, "log_level": 0}).list_topics(timeout=5)
    wrong = k.security.model_copy(update={"password_file": None, "password": SecretStr("wrong")}).librdkafka()
    with pytest.raises(KafkaException):
        AdminClient({"bootstrap.servers": k.bootstrap_servers, "log_level": 0, **wrong}).list_topics(timeout=5)
    # Redis: the user works within its keys only; no TLS, no password, or another key space is refused
    r = s.redis
    client = redis.Redis.from_url(r.url, **r.connection_kwargs())
    client.set("rtrec:probe", b"1")
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.set("other:probe", b"1")
    with pytest.raises(redis.ConnectionError):
        redis.Redis(host="127.0.0.1", port=secured.cfg.redis_port, socket_timeout=3).ping()
    no_password = {k: v for k, v in r.connection_kwargs().items() if k != "password"}
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(r.url, **no_password).ping()
    status = CliRunner().invoke(cli, ["services", "status"], env=env_of(s.model_copy(update={"services": secured.cfg})))
    assert "(SASL_SSL)" in status.output and "rediss://" in status.output, status.output


def test_the_whole_loop_runs_secured_and_no_password_is_written_anywhere(secured: Secured, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RTREC_CONFIG": str(secured.credentials.client_toml),
           "RTREC_FLINK__CHECKPOINT_DIR": str(tmp_path / "checkpoints"),
           "RTREC_FLINK__LOG_DIR": str(tmp_path / "flink-logs"),
           "RTREC_TRAINER__SNAPSHOT_DIR": str(tmp_path / "snapshots"),
           "RTREC_FLINK__ATTRIBUTION_WINDOW_S": "5"}
    # 50 s: a sample is emitted once the watermark is past its impression by the attribution window and
    # the longest horizon's slide (30 s), so shorter runs end before the first one
    done = subprocess.run([sys.executable, "-m", "rtrec", "demo", "--seconds", "50", "--rate", "60",
                           "--out", str(tmp_path / "demo-out")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=420)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    redis_entities = int(re.search(r"features in Redis (\d+) entities", out).group(1))
    samples = int(re.search(r"training samples\s+(\d+)", out).group(1))
    promoted = re.search(r"promoted \[([\d, ]+)\]", out)
    assert redis_entities > 0 and samples > 0 and promoted, out[-3000:]
    # freshness up to Redis, and up to the loader (the job's and Kafka's part of it)
    assert re.search(r"window close -> Redis, windows p50 [\d.]+s p99", out), out[-3000:]
    assert re.search(r"window close -> loader, windows p50 [\d.]+s p99", out), out[-3000:]
    (tmp_path / "demo.out").write_text(out)
    secrets = secured.passwords()
    assert not [s for s in secrets if s in out]
    leaked = files_with(tmp_path, secrets) + files_with(secured.cfg.state_dir, secrets)
    assert not leaked, leaked


def _no_write_user(secured: Secured, s: Settings) -> KafkaSecuritySettings:
    """A second user with the pipeline's ACLs but for WRITE on the features topic."""
    admin = secured.admin()
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096)
    for future in admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(NO_WRITE_USER, info, NO_WRITE_PASSWORD.encode())]).values():
        future.result()
    principal, t = f"User:{NO_WRITE_USER}", s.kafka.topics
    grants = [binding for binding in pipeline_acls(secured.cfg) if binding.restype != ResourceType.TOPIC]
    grants = [AclBinding(b.restype, b.name, b.resource_pattern_type, principal, "*", b.operation, b.permission_type)
              for b in grants]
    for topic, ops in ((t.events, ("READ", "DESCRIBE")), (t.features, ("READ", "DESCRIBE")),
                       (t.samples, ("WRITE", "DESCRIBE")),
                       (t.dead_letter, ("WRITE", "DESCRIBE", "READ"))):  # `features run` tallies dead letters
        grants += [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, principal, "*",
                              AclOperation[op], AclPermissionType.ALLOW) for op in ops]
    for future in admin.create_acls(grants, request_timeout=30).values():
        future.result()
    return s.kafka.security.model_copy(update={"username": NO_WRITE_USER, "password_file": None,
                                               "password": SecretStr(NO_WRITE_PASSWORD)})


def test_a_user_without_write_on_the_features_topic_fails_the_job_naming_the_acl(secured: Secured,
                                                                                tmp_path: Path) -> None:
    base = secured.client()
    s = job_settings(base.model_copy(update={"kafka": base.kafka.model_copy(update={
        "topics": base.kafka.topics.suffixed(f"acl{os.getpid()}")})}), checkpoint_dir=tmp_path / "checkpoints",
        log_dir=tmp_path / "flink-logs", max_restarts=1, restart_delay_ms=500, group_id="rtrec-features-acl")
    create_topics(s)
    produce(s, [event(f"e{i}", "impression", f"u{i % 3}", "i1", i * 1000) for i in range(12)])
    denied = s.model_copy(update={"kafka": s.kafka.model_copy(update={"security": _no_write_user(secured, s)})})
    env = {**os.environ, **env_of(denied), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "rtrec", "features", "run", "--fresh", "--no-loader"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert (f"Kafka user {NO_WRITE_USER} lacks the WRITE ACL on topic {s.kafka.topics.features}" in out), out[-3000:]
    assert NO_WRITE_PASSWORD not in out and not files_with(tmp_path, [NO_WRITE_PASSWORD])


def test_the_flink_rest_api_shows_no_password(secured: Secured, tmp_path: Path) -> None:
    """The job graph, its configuration and the cluster's configuration, as the Flink UI shows them."""
    base = secured.client()
    s = job_settings(base.model_copy(update={"kafka": base.kafka.model_copy(update={
        "topics": base.kafka.topics.suffixed(f"rest{os.getpid()}")})}), checkpoint_dir=tmp_path / "checkpoints",
        log_dir=tmp_path / "flink-logs", group_id="rtrec-features-rest")
    create_topics(s)
    env = {**os.environ, **env_of(s), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "rtrec", "features", "run", "--fresh", "--no-loader"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while (job := RunningJob.find(s.flink.checkpoint_dir)) is None:
            assert proc.poll() is None and time.monotonic() < deadline, "the job did not start"
            time.sleep(1)
        rest, job_id = job.rest_url, job.job_id
        pages = [f"/jobs/{job_id}", f"/jobs/{job_id}/plan", f"/jobs/{job_id}/config", "/jobmanager/config",
                 f"/jobs/{job_id}/exceptions"]
        shown = "".join(urllib.request.urlopen(rest + page, timeout=10).read().decode() for page in pages)
        assert "features_sink" in shown
        assert not [p for p in secured.passwords() if p in shown]
    finally:
        proc.terminate()
        proc.wait(60)


def test_a_job_submitted_to_a_standalone_cluster_runs_secured(secured: Secured, tmp_path: Path) -> None:
    """`flink run` of the job file with the secured settings: the job graph is built where it is submitted
    and carries the connector's SASL_SSL properties to the cluster's task managers."""
    base = secured.client()
    s = job_settings(base.model_copy(update={"kafka": base.kafka.model_copy(update={
        "topics": base.kafka.topics.suffixed(f"cluster{os.getpid()}")})}),
        checkpoint_dir=tmp_path / "cluster-checkpoints", group_id="rtrec-features-cluster")
    create_topics(s)
    produce(s, [event("e1", "impression", "u1", "i1", 100), event("e2", "impression", "u2", "i1", 30_000)])
    cluster = FlinkCluster(secured.cfg.model_copy(update={"state_dir": tmp_path / "cluster"}),
                           rest_port=free_port(), rpc_port=free_port())
    assert cluster.start().startswith("started on")
    try:
        env = {k: v for k, v in env_of(s).items() if k.startswith(("RTREC_KAFKA__", "RTREC_FLINK__"))}
        job_id = cluster.submit(["--no-samples"], env=env)
        features = wait_for(s, s.kafka.topics.features, "FeatureRecord",
                            lambda got: any(r["entity_id"] == "u1" for r in got.records), timeout_s=120)
        assert {"u1", "i1"} <= {r["entity_id"] for r in features.records}
        shown = "".join(urllib.request.urlopen(cluster.rest_url + page, timeout=10).read().decode()
                        for page in (f"/jobs/{job_id}", f"/jobs/{job_id}/plan", f"/jobs/{job_id}/config",
                                     "/jobmanager/config", "/taskmanagers"))
        assert not [p for p in secured.passwords() if p in shown]
        cluster.cancel(job_id)
    finally:
        cluster.stop()
    assert not files_with(tmp_path, secured.passwords())


def test_a_backfill_runs_secured(secured: Secured, tmp_path: Path) -> None:
    """`rtrec features backfill` (a bounded run of the job, its own topics, the loader into Redis) through
    the secured services and the settings file alone."""
    base = secured.client()
    s = job_settings(base.model_copy(update={"kafka": base.kafka.model_copy(update={
        "topics": base.kafka.topics.suffixed(f"backfill{os.getpid()}")})}), checkpoint_dir=tmp_path / "checkpoints",
        log_dir=tmp_path / "flink-logs", group_id="rtrec-features-backfill")
    create_topics(s)
    produce(s, [event(f"e{k}", "impression", f"u{k % 2}", "i1", 500 * k) for k in range(12)])
    env = {**os.environ, **env_of(s), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "rtrec", "features", "backfill", "--no-samples"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    loaded = re.search(r"finished: (\d+) feature records loaded", out)
    assert loaded and int(loaded.group(1)) > 0, out[-2000:]
    r = s.redis
    values = list(redis.Redis.from_url(r.url, **r.connection_kwargs()).scan_iter(f"{r.key_prefix}:f:user:*"))
    assert values, "no user features in the secured Redis"
    assert not [p for p in secured.passwords() if p in out] and not files_with(tmp_path, secured.passwords())
