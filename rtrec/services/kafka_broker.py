"""A single-node Kafka 4 broker in KRaft mode (combined broker + controller) from Maven jars."""

from __future__ import annotations

import base64
import shutil
import subprocess
import uuid
from pathlib import Path

from core.maven import MavenError, classpath, resolve_jars
from core.settings import ServicesSettings
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
        self.home = cfg.state_dir / NAME
        self.data_dir = self.home / "data"
        self.pid_file = self.home / "kafka.pid"
        self.log_file = self.home / "kafka.log"
        self.bootstrap = f"{cfg.host}:{cfg.kafka_port}"

    def pid(self) -> int | None:
        return read_pid(self.pid_file)

    def healthy(self, timeout_s: float = 2.0) -> bool:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.connection.setup.timeout.ms": 1000,
                             "log_level": 0})
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
        props.write_text(server_properties(self.cfg.host, self.cfg.kafka_port, self.cfg.kafka_controller_port,
                                           self.data_dir))
        log4j = self.home / "log4j2.properties"
        log4j.write_text(LOG4J2)
        jvm = [java, f"-Xmx{self.cfg.kafka_heap}", f"-Xms{self.cfg.kafka_heap}", "-XX:+UseG1GC",
               f"-Dlog4j2.configurationFile={log4j}", f"-Drtrec.kafka.log={self.log_file}",
               "-cp", classpath(jars)]
        if not (self.data_dir / "meta.properties").exists():
            self._format(jvm, props)
        pid = start_detached([*jvm, "kafka.Kafka", str(props)], self.home / "kafka.stdout", self.pid_file, self.home)
        wait_healthy(NAME, pid, self.healthy, self.cfg.start_timeout_s, self.log_file)
        return f"started pid {pid} on {self.bootstrap}"

    def _format(self, jvm: list[str], props: Path) -> None:
        cluster_id = random_cluster_id()
        result = subprocess.run([*jvm, "kafka.tools.StorageTool", "format", "--standalone", "-t", cluster_id,
                                 "-c", str(props)], capture_output=True, text=True)
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
        return f"running pid {pid} on {self.bootstrap}" + ("" if self.healthy() else " (not answering)")


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
