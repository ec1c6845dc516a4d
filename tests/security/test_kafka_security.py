"""A secured Kafka, for real: a KRaft broker whose only client listener is SASL_SSL (SCRAM-SHA-512, the
user created when the storage is formatted; a PEM certificate signed by the run's CA). The Python
clients and the feature job's connector reach it through `KafkaSecuritySettings`; a wrong password and
a client without TLS are refused; the password appears in no log or output."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from core.kafka import group_lag
from core.settings import KafkaSecuritySettings, Settings
from rtrec.services.credentials import make_certs
from schemas.kafka_io import ConsumedBatch, read_topic
from tests.flink_jobs.harness import create_topics, event, job_settings, produce, running_job, wait_for
from tests.infra import free_port
from tests.security.brokers import broker_properties, running_broker

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("java") is None or shutil.which("openssl") is None,
                                 reason="needs java and openssl")]

PASSWORD = "kafka-pw-51c0e2-not-in-any-output"


@dataclass
class SecuredKafka:
    bootstrap: str
    certs: Path
    password_file: Path
    log_file: Path

    def security(self, **change: object) -> KafkaSecuritySettings:
        fields: dict[str, object] = {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
                                     "username": "rtrec", "password_file": self.password_file,
                                     "ssl_ca_file": self.certs / "ca.pem"}
        return KafkaSecuritySettings(**(fields | change))


SCRAM_LINES = ["sasl.enabled.mechanisms=SCRAM-SHA-512",
               "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
               "org.apache.kafka.common.security.scram.ScramLoginModule required;"]


@pytest.fixture(scope="module")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    home = tmp_path_factory.mktemp("secured-kafka")
    (home / "certs").mkdir()
    certs = make_certs(home / "certs")
    port, internal, controller = free_port(), free_port(), free_port()
    (home / "password").write_text(PASSWORD)
    server = SecuredKafka(f"127.0.0.1:{port}", certs, home / "password", home / "kafka.log")
    properties = broker_properties(port, internal, controller, certs, home / "data", SCRAM_LINES)
    # The SCRAM credential is written into the metadata log when the storage is formatted.
    scram = ["--add-scram", f"SCRAM-SHA-512=[name=rtrec,password={PASSWORD}]"]
    with running_broker(home, properties, {"bootstrap.servers": server.bootstrap, **server.security().librdkafka()},
                        format_args=scram):
        yield server


def secured_settings(settings: Settings, server: SecuredKafka, tmp_path: Path) -> Settings:
    kafka = settings.kafka.model_copy(update={"bootstrap_servers": server.bootstrap, "security": server.security()})
    return job_settings(settings.model_copy(update={"kafka": kafka}), checkpoint_dir=tmp_path / "checkpoints",
                        log_dir=tmp_path / "flink-logs")


def test_python_clients_and_the_feature_job_work_over_sasl_ssl(settings: Settings, secured_kafka: SecuredKafka,
                                                                tmp_path: Path) -> None:
    s = secured_settings(settings, secured_kafka, tmp_path)
    create_topics(s)
    events = [event("e1", "impression", "u1", "i1", 100), event("e2", "click", "u1", "i1", 900, dwell=500),
              event("e3", "impression", "u2", "i1", 2500), event("e4", "impression", "u3", "i2", 30_000)]
    produce(s, events)
    got = read_topic(s.kafka.bootstrap_servers, s.kafka.topics.events, "InteractionEvent", timeout_s=30,
                     security=s.kafka.security.librdkafka())
    assert len(got.records) == 4

    def windows_closed(batch: ConsumedBatch) -> bool:
        return any(r["entity_type"] == "user_item" for r in batch.records)

    with running_job(s, with_samples=False):
        features = wait_for(s, s.kafka.topics.features, "FeatureRecord", windows_closed, timeout_s=120)
    users = {(r["entity_id"], r["horizon_s"]) for r in features.records if r["entity_type"] == "user"}
    assert {("u1", 3), ("u2", 3)} <= users
    lag = group_lag(s.kafka.bootstrap_servers, s.flink.group_id, s.kafka.topics.events,
                    security=s.kafka.security.librdkafka())
    assert set(lag) == {0}

    logs = [p for p in tmp_path.rglob("*") if p.is_file()] + [secured_kafka.log_file]
    assert logs and not [p for p in logs if PASSWORD in p.read_text(errors="replace")]


def test_a_wrong_password_and_a_plain_client_are_refused(secured_kafka: SecuredKafka) -> None:
    wrong = secured_kafka.security(password_file=None, password="not-the-password").librdkafka()
    said: list[KafkaError] = []
    admin = AdminClient({"bootstrap.servers": secured_kafka.bootstrap, **wrong, "error_cb": said.append})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=10)
    admin.poll(1)  # serves the error callback
    # librdkafka names the cause through the error callback: the broker refused the credentials
    assert any(e.code() == KafkaError._AUTHENTICATION and "invalid credentials" in e.str() for e in said), said
    plain = AdminClient({"bootstrap.servers": secured_kafka.bootstrap})
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=5)


def test_the_settings_never_show_the_password(secured_kafka: SecuredKafka) -> None:
    security = secured_kafka.security(password_file=None, password=PASSWORD)
    shown = repr(security) + str(security.model_dump()) + security.model_dump_json()
    assert PASSWORD not in shown
    with pytest.raises(ValueError, match="needs kafka.security.password or password_file"):
        secured_kafka.security(password_file=None).librdkafka()


def test_refused_credentials_end_a_command_with_one_line(secured_kafka: SecuredKafka, settings: Settings,
                                                         tmp_path: Path) -> None:
    """librdkafka would retry refused credentials forever: the command stops, says why, exits 1."""
    from click.testing import CliRunner

    from rtrec.cli.main import cli

    env = {"RTREC_KAFKA__BOOTSTRAP_SERVERS": secured_kafka.bootstrap, "RTREC_KAFKA__SECURITY__PROTOCOL": "SASL_SSL",
           "RTREC_KAFKA__SECURITY__USERNAME": "rtrec", "RTREC_KAFKA__SECURITY__PASSWORD": "not-the-password",
           "RTREC_KAFKA__SECURITY__SSL_CA_FILE": str(secured_kafka.certs / "ca.pem"),
           "RTREC_KAFKA__TOPICS__SAMPLES": settings.kafka.topics.samples}
    started = time.monotonic()
    result = CliRunner().invoke(cli, ["consume", "samples", "--timeout", "30"], env=env)
    assert result.exit_code == 1, result.output
    assert f"Kafka at {secured_kafka.bootstrap} refused user rtrec" in result.output
    assert "invalid credentials" in result.output and "not-the-password" not in result.output
    assert time.monotonic() - started < 25
