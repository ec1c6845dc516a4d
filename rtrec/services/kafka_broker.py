"""A single-node Kafka 4 broker in KRaft mode (combined broker + controller) from Maven jars; secured
(`services.secure.enabled`), its only client listener is SASL_SSL with SCRAM users and ACLs."""

from __future__ import annotations

import base64
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

from core.maven import MavenError, classpath, resolve_jars
from core.settings import KafkaSecuritySettings, ServicesSettings
from rtrec.services.credentials import PRIVATE, LocalCredentials
from rtrec.services.process import (
    ServiceError,
    read_pid,
    require_free_port,
    start_detached,
    stop_pid,
    wait_healthy,
)

NAME = "kafka"


def server_properties(host: str, port: int, controller_port: int, data_dir: Path) -> str:
    """The broker config. The transaction timeout cap is raised so Flink's exactly-once sink (1 h
    default transaction timeout) is accepted; the rebalance delay is zeroed for fast consumers.

    >>> "listeners=PLAINTEXT://127.0.0.1:9092" in server_properties("127.0.0.1", 9092, 9093, Path("/d"))
    True
    """
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.bootstrap.servers={host}:{controller_port}",
        f"listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        f"advertised.listeners=PLAINTEXT://{host}:{port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "inter.broker.listener.name=PLAINTEXT",
        f"log.dirs={data_dir}",
        "num.partitions=2",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=4",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=4",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "transaction.max.timeout.ms=3600000",
        "auto.create.topics.enable=true",
        # Retention is by record timestamp, and replays of historical logs carry old event times: a
        # 7-day default would delete a 2019 log minutes after it is replayed. Keep everything locally.
        "log.retention.ms=-1",
        "",
    ])


ADMIN = "admin"
_SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
_PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"


def secured_properties(plain: str, host: str, port: int, controller_port: int, credentials: LocalCredentials) -> str:
    """`plain` (server_properties) turned into a secured broker: clients reach only a SASL_SSL listener
    (SCRAM-SHA-512, the users written at format time), the controller listener asks for the admin's
    PLAIN login, and the StandardAuthorizer allows nothing that no ACL grants (the admin is the
    super user). The admin's password is in this file: it is written mode 600."""
    admin_pw = credentials.password("kafka-admin")
    replaced = {
        "listeners": f"SASL_SSL://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"SASL_SSL://{host}:{port}",
        "listener.security.protocol.map": "CONTROLLER:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
        "inter.broker.listener.name": "SASL_SSL",
    }
    lines = [f"{key}={replaced[key]}" if key in replaced else line
             for line in plain.splitlines() for key in [line.split("=", 1)[0]]]
    lines += [
        "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
        "sasl.mechanism.controller.protocol=PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
        f'listener.name.controller.plain.sasl.jaas.config={_PLAIN} required username="{ADMIN}" '
        f'password="{admin_pw}" user_{ADMIN}="{admin_pw}";',
        "listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512",
        f'listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={_SCRAM} required username="{ADMIN}" '
        f'password="{admin_pw}";',
        "ssl.keystore.type=PEM", f"ssl.keystore.location={credentials.server_keystore}",
        "ssl.truststore.type=PEM", f"ssl.truststore.location={credentials.ca}",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        f"super.users=User:{ADMIN}", "allow.everyone.if.no.acl.found=false", "",
    ]
    return "\n".join(lines)


def admin_security(credentials: LocalCredentials) -> KafkaSecuritySettings:
    return KafkaSecuritySettings(protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", username=ADMIN,
                                 password_file=credentials.password_file("kafka-admin"), ssl_ca_file=credentials.ca)


LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:rtrec.kafka.log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
logger.kafka.name = kafka
logger.kafka.level = warn
logger.state.name = state.change.logger
logger.state.level = warn
logger.org.name = org.apache.kafka
logger.org.level = warn
"""


class KafkaBroker:
    def __init__(self, cfg: ServicesSettings) -> None:
        self.cfg = cfg
        self.secure = cfg.secure.enabled
        self.credentials = LocalCredentials.of(cfg)
        # a secured broker's storage holds its users: it is not the plain one's
        self.home = cfg.state_dir / (f"{NAME}-secure" if self.secure else NAME)
        self.data_dir = self.home / "data"
        self.pid_file = self.home / "kafka.pid"
        self.log_file = self.home / "kafka.log"
        self.bootstrap = f"{cfg.host}:{cfg.kafka_port}"

    def pid(self) -> int | None:
        return read_pid(self.pid_file)

    def admin_config(self) -> dict[str, str]:
        """The librdkafka settings of the broker's admin (empty for a plain broker)."""
        return admin_security(self.credentials).librdkafka() if self.secure else {}

    def healthy(self, timeout_s: float = 2.0) -> bool:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.connection.setup.timeout.ms": 1000,
                             "log_level": 0, **self.admin_config()})
        try:
            meta = admin.list_topics(timeout=timeout_s)
        except Exception:
            return False
        return bool(meta.brokers)

    def start(self) -> str:
        if self.pid() is not None:
            if self.healthy():
                return "already running"
            raise ServiceError(
                f"kafka process {self.pid()} exists but does not answer; run `rtrec services down` first"
            )
        java = shutil.which("java")
        if java is None:
            raise ServiceError(
                "Java 17+ (`java`) is needed for the Kafka broker; install it "
                "(Debian: apt-get install openjdk-17-jre-headless)."
            )
        require_free_port("kafka", self.cfg.host, self.cfg.kafka_port, "RTREC_SERVICES__KAFKA_PORT")
        require_free_port("kafka controller", self.cfg.host, self.cfg.kafka_controller_port,
                          "RTREC_SERVICES__KAFKA_CONTROLLER_PORT")
        try:
            jars = resolve_jars("kafka-pom.xml", self.cfg.jar_cache_dir)
        except MavenError as exc:
            raise ServiceError(str(exc)) from exc
        self.home.mkdir(parents=True, exist_ok=True)
        props = self.home / "server.properties"
        text = server_properties(self.cfg.host, self.cfg.kafka_port, self.cfg.kafka_controller_port, self.data_dir)
        if self.secure:
            self.credentials.ensure(self.cfg)
            text = secured_properties(text, self.cfg.host, self.cfg.kafka_port, self.cfg.kafka_controller_port,
                                      self.credentials)
        props.touch(PRIVATE)
        props.chmod(PRIVATE)
        props.write_text(text)
        log4j = self.home / "log4j2.properties"
        log4j.write_text(LOG4J2)
        jvm = [java, f"-Xmx{self.cfg.kafka_heap}", f"-Xms{self.cfg.kafka_heap}", "-XX:+UseG1GC",
               f"-Dlog4j2.configurationFile={log4j}", f"-Drtrec.kafka.log={self.log_file}",
               "-cp", classpath(jars)]
        if not (self.data_dir / "meta.properties").exists():
            self._format(jvm, props)
        pid = start_detached([*jvm, "kafka.Kafka", str(props)], self.home / "kafka.stdout", self.pid_file, self.home)
        wait_healthy(NAME, pid, self.healthy, self.cfg.start_timeout_s, self.log_file)
        if self.secure:
            grant_pipeline_acls(self.bootstrap, self.admin_config(), self.cfg)
            return (f"started pid {pid} on {self.bootstrap} (SASL_SSL, SCRAM-SHA-512; ACLs for "
                    f"User:{self.cfg.secure.user})")
        return f"started pid {pid} on {self.bootstrap}"

    def _format(self, jvm: list[str], props: Path) -> None:
        args = ["kafka.tools.StorageTool", "format", "--standalone", "-t", random_cluster_id(), "-c", str(props)]
        if self.secure:
            for user, who in ((ADMIN, "kafka-admin"), (self.cfg.secure.user, "kafka-user")):
                args += ["--add-scram", f"SCRAM-SHA-512=[name={user},password={self.credentials.password(who)}]"]
        # The arguments go through a java @argfile (mode 600, removed after) so that no password is on
        # a command line that `ps` shows.
        argfile = self.home / "format.args"
        argfile.touch(PRIVATE)
        argfile.write_text("\n".join(args) + "\n")
        try:
            result = subprocess.run([*jvm, f"@{argfile}"], capture_output=True, text=True)
        finally:
            argfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise ServiceError(
                f"formatting the KRaft storage in {self.data_dir} failed:\n{result.stdout}{result.stderr}"
            )

    def stop(self) -> str:
        pid = self.pid()
        if pid is None:
            return "not running"
        stop_pid(pid, self.cfg.stop_timeout_s)
        self.pid_file.unlink(missing_ok=True)
        return f"stopped pid {pid}"

    def status(self) -> str:
        pid = self.pid()
        if pid is None:
            return "stopped"
        return (f"running pid {pid} on {self.bootstrap}" + (" (SASL_SSL)" if self.secure else "")
                + ("" if self.healthy() else " (not answering)"))


def random_cluster_id() -> str:
    """A KRaft cluster id as Kafka's own Uuid.randomUuid() makes it: URL-safe base64 of 16 random
    bytes, drawn again when it starts with '-' (the storage tool would read it as an option; about
    one start in 64 failed that way).

    >>> all(not random_cluster_id().startswith("-") and len(random_cluster_id()) == 22 for _ in range(500))
    True
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def pipeline_acls(cfg: ServicesSettings) -> list[Any]:
    """What the pipeline's user may do: read, write, create, delete and describe the topics named with
    the topic prefix; use the consumer groups and transactional ids named with the id prefix."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    sec = cfg.secure
    principal = f"User:{sec.user}"
    grants = [(ResourceType.TOPIC, sec.topic_prefix, op) for op in (
        AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE, AclOperation.DESCRIBE,
        AclOperation.DESCRIBE_CONFIGS)]
    grants += [(ResourceType.GROUP, sec.id_prefix, op) for op in (
        AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE)]
    grants += [(ResourceType.TRANSACTIONAL_ID, sec.id_prefix, op) for op in (AclOperation.WRITE, AclOperation.DESCRIBE)]
    return [AclBinding(kind, name, ResourcePatternType.PREFIXED, principal, "*", op, AclPermissionType.ALLOW)
            for kind, name, op in grants]


def grant_pipeline_acls(bootstrap: str, admin_config: dict[str, str], cfg: ServicesSettings) -> None:
    """Creates the pipeline's ACLs (creating one that exists changes nothing)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, **admin_config})
    for binding, future in admin.create_acls(pipeline_acls(cfg), request_timeout=30).items():
        try:
            future.result()
        except Exception as exc:
            raise ServiceError(f"creating the ACL {binding} failed: {exc}") from exc
