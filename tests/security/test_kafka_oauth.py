"""OAUTHBEARER, for real: a KRaft broker whose only client listener is SASL_SSL with OAUTHBEARER,
validating RS256 tokens against the JWKS of a small OIDC provider (tests/security/oidc.py). The Python
clients (librdkafka's OIDC client-credentials grant) and the feature job's connector (the Java client's
login callback handler, shaded) fetch their tokens from the provider with the client id and secret of
`kafka.security`; a wrong secret gets no token and no connection; the secret is in no log. The job runs
as `rtrec features run`, in a process of its own."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from pydantic import SecretStr

from core.settings import KafkaSecuritySettings, Settings
from rtrec.services.credentials import make_certs
from schemas.kafka_io import ConsumedBatch, read_topic
from tests.faults.runs import rtrec_process
from tests.flink_jobs.harness import create_topics, event, job_settings, produce, wait_for
from tests.infra import free_port
from tests.security.brokers import broker_properties, running_broker
from tests.security.oidc import Provider, oidc_provider

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("java") is None or shutil.which("openssl") is None,
                                 reason="needs java and openssl")]

CLIENT_ID = "rtrec-pipeline"
SECRET = "oidc-secret-4e1d-not-in-any-output"
_OAUTH = "org.apache.kafka.common.security.oauthbearer."


@dataclass
class OAuthKafka:
    bootstrap: str
    certs: Path
    token_url: str
    provider: Provider
    log_file: Path

    def security(self, secret: str = SECRET) -> KafkaSecuritySettings:
        return KafkaSecuritySettings(protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", username=CLIENT_ID,
                                     password=SecretStr(secret), ssl_ca_file=self.certs / "ca.pem",
                                     oauth_token_endpoint_url=self.token_url, oauth_scope="kafka")


@pytest.fixture(scope="module")
def oauth_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthKafka]:
    home = tmp_path_factory.mktemp("oauth-kafka")
    (home / "certs").mkdir()
    certs = make_certs(home / "certs")
    with oidc_provider(home, CLIENT_ID, SECRET) as (provider, url):
        port, internal, controller = free_port(), free_port(), free_port()
        oauth_lines = [
            "sasl.enabled.mechanisms=OAUTHBEARER",
            f"listener.name.sasl_ssl.oauthbearer.sasl.jaas.config={_OAUTH}OAuthBearerLoginModule required;",
            f"listener.name.sasl_ssl.oauthbearer.sasl.server.callback.handler.class="
            f"{_OAUTH}OAuthBearerValidatorCallbackHandler",
            f"sasl.oauthbearer.jwks.endpoint.url={url}/jwks", "sasl.oauthbearer.expected.issuer=rtrec-test"]
        server = OAuthKafka(f"127.0.0.1:{port}", certs, f"{url}/token", provider, home / "kafka.log")
        properties = broker_properties(port, internal, controller, certs, home / "data", oauth_lines)
        # Kafka 4 fetches keys only from URLs a system property allows
        allow = [f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={url}/jwks"]
        with running_broker(home, properties, {"bootstrap.servers": server.bootstrap,
                                               **server.security().librdkafka()}, jvm_args=allow):
            yield server


def test_python_clients_and_the_feature_job_authenticate_with_oidc_tokens(settings: Settings,
                                                                          oauth_kafka: OAuthKafka,
                                                                          tmp_path: Path) -> None:
    kafka = settings.kafka.model_copy(update={"bootstrap_servers": oauth_kafka.bootstrap,
                                              "security": oauth_kafka.security()})
    s = job_settings(settings.model_copy(update={"kafka": kafka}), checkpoint_dir=tmp_path / "checkpoints",
                     log_dir=tmp_path / "flink-logs")
    create_topics(s)
    produce(s, [event("e1", "impression", "u1", "i1", 100), event("e2", "impression", "u2", "i1", 30_000)])
    assert len(read_topic(s.kafka.bootstrap_servers, s.kafka.topics.events, "InteractionEvent", timeout_s=30,
                          security=s.kafka.security.librdkafka()).records) == 2
    python_tokens = len(oauth_kafka.provider.issued)

    def closed(batch: ConsumedBatch) -> bool:
        return any(r["entity_id"] == "u1" for r in batch.records)

    # In a process of its own, as `features run` always is: the connector must go on the classpath of the
    # JVM it starts (flink_jobs/environment.py, connector_on_gateway_classpath)
    log = tmp_path / "features-run.log"
    job = rtrec_process(s, log, "features", "run", "--fresh", "--no-loader")
    try:
        features = wait_for(s, s.kafka.topics.features, "FeatureRecord", closed, timeout_s=150)
    finally:
        job.terminate()
        job.wait(90)
    assert {"u1", "i1"} <= {r["entity_id"] for r in features.records}, log.read_text()[-3000:]
    # the job's Java clients fetched tokens of their own from the provider
    assert len(oauth_kafka.provider.issued) > python_tokens and set(oauth_kafka.provider.issued) == {CLIENT_ID}
    logs = [p for p in tmp_path.rglob("*") if p.is_file()] + [oauth_kafka.log_file]
    assert not [p for p in logs if SECRET in p.read_text(errors="replace")]


def test_a_wrong_client_secret_gets_no_token_and_no_connection(oauth_kafka: OAuthKafka) -> None:
    refused_before = oauth_kafka.provider.refused
    said: list[KafkaError] = []
    admin = AdminClient({"bootstrap.servers": oauth_kafka.bootstrap, "log_level": 0, "error_cb": said.append,
                         **oauth_kafka.security(secret="not-the-secret").librdkafka()})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=10)
    admin.poll(1)
    assert oauth_kafka.provider.refused > refused_before
    assert said and all("not-the-secret" not in e.str() for e in said)


def test_oauthbearer_settings_need_a_token_endpoint() -> None:
    security = KafkaSecuritySettings(protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", username="c",
                                     password=SecretStr("s"))
    with pytest.raises(ValueError, match="needs kafka.security.oauth_token_endpoint_url"):
        security.librdkafka()
    connector = security.model_copy(update={"oauth_token_endpoint_url": "https://idp/token"}).flink_connector()
    assert connector["sasl.login.callback.handler.class"].startswith("org.apache.flink.kafka.shaded.")
    assert 'clientId="c" clientSecret="s";' in connector["sasl.jaas.config"]
