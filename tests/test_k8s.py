"""scripts/k8s/: the manifests agree with the project (images, commands, settings, the scaling policy).
Their custom resources were also checked against the Flink Kubernetes Operator's and KEDA's CRD schemas
(README: "On Kubernetes"); this test needs no cluster and no network."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from core.settings import AutoscaleSettings, FlinkSettings, Settings, TopicSettings
from tests.test_compose import interpolated

ROOT = Path(__file__).parents[1]
K8S = ROOT / "scripts" / "k8s"


@pytest.fixture(scope="module")
def docs() -> dict[tuple[str, str], dict]:
    found = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def test_every_setting_named_is_one_the_pipeline_reads(docs: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    data = docs[("ConfigMap", "rtrec-settings")]["data"]
    env = dict(data)
    for kind, name in docs:
        if kind == "Deployment":
            for container in docs[(kind, name)]["spec"]["template"]["spec"]["containers"]:
                env |= {e["name"]: e["value"] for e in container.get("env", [])}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()  # an unknown key or a wrong value raises here
    assert settings.kafka.security.protocol == "SASL_SSL" and settings.redis.url.startswith("rediss://")
    secret = docs[("Secret", "rtrec-credentials")]["stringData"]
    mount = "/etc/rtrec/secrets/"
    for path in (data["RTREC_KAFKA__SECURITY__PASSWORD_FILE"], data["RTREC_REDIS__PASSWORD_FILE"],
                 data["RTREC_KAFKA__SECURITY__SSL_CA_FILE"]):
        assert path.startswith(mount) and path.removeprefix(mount) in secret
    assert not any("PASSWORD" in key and not key.endswith("_FILE") for key in env)  # passwords stay in files


def test_images_commands_and_mounts(docs: dict) -> None:
    from rtrec.cli.main import cli

    compose = yaml.safe_load(interpolated((ROOT / "docker-compose.yml").read_text()))
    images = {s.get("image") for s in compose["services"].values()}
    flink = docs[("FlinkDeployment", "rtrec-features")]["spec"]
    assert flink["image"] in images and flink["flinkVersion"] == "v2_2"
    assert flink["job"]["args"][-1] == "/opt/rtrec/flink_jobs/submit.py"
    assert "COPY flink_jobs/ /opt/rtrec/flink_jobs/" in (ROOT / "scripts/docker/Dockerfile.flink").read_text()
    assert flink["flinkConfiguration"]["job.autoscaler.enabled"] == "true"
    for name in ("rtrec-redis-loader", "rtrec-trainer"):
        container = docs[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]
        assert container["image"] in images
        result = CliRunner().invoke(cli, [*container["args"], "--help"])
        assert result.exit_code == 0, result.output
        assert {"name": "credentials", "mountPath": "/etc/rtrec/secrets", "readOnly": True} in container["volumeMounts"]
    # one trainer pod: two in one consumer group would train two models on half the data each
    assert docs[("Deployment", "rtrec-trainer")]["spec"]["replicas"] == 1
    assert "ScaledObject" not in {kind for kind, name in docs if name == "rtrec-trainer"}


def test_the_trainer_pod_scales_its_ranks_by_the_lag_policy_within_its_cpus(docs: dict) -> None:
    spec = docs[("Deployment", "rtrec-trainer")]["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["args"][:2] == ["train", "autoscale"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert int(env["RTREC_TRAINER__AUTOSCALE__MAX_WORKERS"]) == int(container["resources"]["requests"]["cpu"])
    assert env["OMP_NUM_THREADS"] == "1"  # a rank per CPU, not each rank on every CPU
    metrics_port = int(env["RTREC_TRAINER__METRICS_PORT"])
    autoscale_port = int(container["args"][container["args"].index("--metrics-port") + 1])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": metrics_port, "autoscale": autoscale_port} and metrics_port != autoscale_port
    assert container["readinessProbe"]["httpGet"]["port"] == "autoscale"  # up before any rank is


def test_the_loader_scales_by_the_lag_policy(docs: dict) -> None:
    scaled = docs[("ScaledObject", "rtrec-redis-loader")]["spec"]
    policy, trigger = AutoscaleSettings(), scaled["triggers"][0]["metadata"]
    assert trigger["lagThreshold"] == str(policy.lag_per_worker)
    assert trigger["consumerGroup"] == FlinkSettings().loader_group_id and trigger["topic"] == TopicSettings().features
    behaviour = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behaviour["scaleUp"]["stabilizationWindowSeconds"] == policy.up_cooldown_s
    assert behaviour["scaleDown"]["stabilizationWindowSeconds"] == policy.down_cooldown_s
    data = docs[("ConfigMap", "rtrec-settings")]["data"]
    assert scaled["maxReplicaCount"] == int(data["RTREC_KAFKA__PARTITIONS"])  # more loaders would only wait
    assert trigger["bootstrapServers"] == data["RTREC_KAFKA__BOOTSTRAP_SERVERS"]


ELASTIC = K8S / "elastic-trainer" / "trainer-agents.yaml"


def agent_arguments() -> list[str]:
    """torchrun's arguments in the elastic trainer's pods (tests/gpu_trainer/test_distributed.py runs them)."""
    docs = {doc["kind"]: doc for doc in yaml.safe_load_all(ELASTIC.read_text())}
    return docs["StatefulSet"]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_elastic_trainers_agents_meet_at_the_first_pod_and_scale_by_the_lag_policy(
        docs: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.run import get_args_parser

    from rtrec.cli.main import cli

    elastic = {(doc["kind"], doc["metadata"]["name"]): doc for doc in yaml.safe_load_all(ELASTIC.read_text())}
    assert not set(elastic) & set(docs)  # an alternative to workers.yaml's trainer, not beside it
    service = elastic[("Service", "rtrec-trainer-agents")]["spec"]
    agents = elastic[("StatefulSet", "rtrec-trainer-agents")]
    pod = agents["spec"]["template"]["spec"]
    container = pod["containers"][0]
    args = get_args_parser().parse_args(container["args"])
    assert container["command"] == ["python", "-m", "torch.distributed.run"] and args.module
    assert CliRunner().invoke(cli, [*args.training_script_args, "--help"]).exit_code == 0
    assert args.training_script == "rtrec" and args.nproc_per_node == "1" and args.rdzv_backend == "c10d"
    host, port = args.rdzv_endpoint.split(":")
    assert host == f"{agents['metadata']['name']}-0.{agents['spec']['serviceName']}" and service["clusterIP"] == "None"
    assert int(port) == service["ports"][0]["port"] and service["publishNotReadyAddresses"] is True
    assert agents["spec"]["podManagementPolicy"] == "Parallel" and args.max_restarts > 0
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1" and env["OMP_NUM_THREADS"] == "1"
    for key, value in {**docs[("ConfigMap", "rtrec-settings")]["data"], **env}.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    trainer = docs[("Deployment", "rtrec-trainer")]["spec"]["template"]["spec"]
    assert pod["volumes"] == trainer["volumes"]  # the same snapshots: each resumes from the other's
    assert pod["terminationGracePeriodSeconds"] > settings.trainer.shutdown_timeout_s

    scaled = elastic[("ScaledObject", "rtrec-trainer-agents")]["spec"]
    policy, trigger = settings.trainer.autoscale, scaled["triggers"][0]["metadata"]
    assert scaled["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "rtrec-trainer-agents"}
    assert trigger["lagThreshold"] == str(policy.lag_per_worker)
    assert trigger["consumerGroup"] == settings.trainer.group_id and trigger["topic"] == settings.kafka.topics.samples
    behaviour = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behaviour["scaleUp"]["stabilizationWindowSeconds"] == policy.up_cooldown_s
    assert behaviour["scaleDown"]["stabilizationWindowSeconds"] == policy.down_cooldown_s
    partitions = settings.kafka.partitions_of()[settings.kafka.topics.samples]
    assert scaled["maxReplicaCount"] == partitions == int(args.nnodes.split(":")[1])
    assert trigger["bootstrapServers"] == settings.kafka.bootstrap_servers
