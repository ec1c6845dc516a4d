"""A single-node KRaft broker for the security tests: its only client listener SASL_SSL (the SASL
mechanism's lines given by the test), the broker's own traffic on loopback listeners of its own, a PEM
certificate from the run's CA."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from core.maven import classpath, resolve_jars
from core.settings import load_settings
from rtrec.services.kafka_broker import LOG4J2, random_cluster_id


def broker_properties(port: int, internal: int, controller: int, certs: Path, data: Path,
                      sasl_lines: list[str]) -> str:
    return "\n".join([
        "process.roles=broker,controller", "node.id=1",
        f"controller.quorum.bootstrap.servers=127.0.0.1:{controller}",
        f"listeners=SASL_SSL://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal},CONTROLLER://127.0.0.1:{controller}",
        f"advertised.listeners=SASL_SSL://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal}",
        "controller.listener.names=CONTROLLER", "inter.broker.listener.name=INTERNAL",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,INTERNAL:PLAINTEXT,SASL_SSL:SASL_SSL",
        *sasl_lines,
        "ssl.keystore.type=PEM", f"ssl.keystore.location={certs / 'server-keystore.pem'}",
        f"log.dirs={data}", "num.partitions=1", "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=2", "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1", "transaction.state.log.num.partitions=2",
        "group.initial.rebalance.delay.ms=0", "transaction.max.timeout.ms=3600000",
        # the tests' events carry 2023 timestamps: with the default 7-day retention the broker's first
        # retention pass (30 s after it starts) deletes them, possibly before the job has read them
        "log.retention.ms=-1", "", ])


@contextmanager
def running_broker(home: Path, properties: str, client_config: dict[str, str], format_args: list[str] | None = None,
                   jvm_args: list[str] | None = None) -> Iterator[Path]:
    """Formats and starts the broker in `home`, waits until a client with `client_config` (bootstrap
    included) lists it; yields its log file."""
    props = home / "server.properties"
    props.write_text(properties)
    (home / "log4j2.properties").write_text(LOG4J2)
    log_file = home / "kafka.log"
    jvm = ["java", "-Xmx512m", f"-Dlog4j2.configurationFile={home / 'log4j2.properties'}",
           f"-Drtrec.kafka.log={log_file}", *(jvm_args or []),
           "-cp", classpath(resolve_jars("kafka-pom.xml", load_settings().services.jar_cache_dir))]
    subprocess.run([*jvm, "kafka.tools.StorageTool", "format", "--standalone", "-t", random_cluster_id(),
                    "-c", str(props), *(format_args or [])], check=True, capture_output=True)
    stdout = (home / "kafka.stdout").open("w")
    proc = subprocess.Popen([*jvm, "kafka.Kafka", str(props)], stdout=stdout, stderr=subprocess.STDOUT)
    admin = AdminClient(client_config)
    deadline = time.monotonic() + 90
    while True:
        try:
            if admin.list_topics(timeout=5).brokers:
                break
        except KafkaException:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError(f"the SASL_SSL broker did not start: {(home / 'kafka.stdout').read_text()[-2000:]}"
                               f"{log_file.read_text()[-2000:] if log_file.exists() else ''}")
        time.sleep(1)
    try:
        yield log_file
    finally:
        proc.terminate()
        proc.wait(30)
        stdout.close()
