"""The trainer as torch.distributed ranks under torchrun (gloo, CPU) against the real broker: the ranks
split the samples topic's partitions and train one model; its snapshots hold every partition's offset
and train each sample exactly once, also when a rank is killed with SIGKILL mid-run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.kafka import ensure_topics
from core.settings import Settings
from gpu_trainer.snapshots import Manifest, SnapshotStore
from tests.faults.runs import ROOT, env_of
from tests.gpu_trainer.samples import digest, make_samples, produce_samples
from tests.gpu_trainer.test_service_kafka import trainer_settings
from tests.infra import free_port
from tests.test_k8s import agent_arguments

pytestmark = pytest.mark.integration
PARTITIONS = 3  # two ranks: one with two partitions, one with one


def torchrun(s: Settings, log: Path, ranks: int, *args: str, max_restarts: int = 0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
                             f"--max-restarts={max_restarts}", "-m", "rtrec", "train", "run", *args],
                            cwd=ROOT, env={**os.environ, **env_of(s), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def settings_for(settings: Settings, tmp_path: Path, name: str, partitions: int = PARTITIONS,
                 **trainer: object) -> Settings:
    s = trainer_settings(settings.namespaced(name), tmp_path / name, group_id=f"trainer-{name}-{tmp_path.name}",
                         **trainer)
    ensure_topics(s.kafka.bootstrap_servers, [s.kafka.topics.samples], partitions)
    return s


def final_manifest(s: Settings) -> Manifest:
    store = SnapshotStore(s.trainer.snapshot_dir)
    return store.manifest(store.latest_version())


@pytest.mark.parametrize("exchange", ["samples", "gradients"])
def test_two_ranks_train_every_sample_once_into_one_model(settings: Settings, tmp_path: Path, exchange: str) -> None:
    """Exchanging gradients, each rank steps on its own samples; the replicas are compared at every
    snapshot (a difference would end the ranks)."""
    samples = make_samples(6000)
    single = settings_for(settings, tmp_path, "single")
    ranked = settings_for(settings, tmp_path, "ranked", rank_exchange=exchange)
    for s in (single, ranked):
        produce_samples(s, samples)

    log = tmp_path / "train.log"
    one = subprocess.run([sys.executable, "-m", "rtrec", "train", "run", "--idle-exit", "3"], cwd=ROOT, timeout=300,
                         env={**os.environ, **env_of(single), "PYTHONPATH": str(ROOT)}, capture_output=True)
    assert one.returncode == 0, one.stderr.decode()[-3000:]
    two = torchrun(ranked, log, 2, "--idle-exit", "3")
    assert two.wait(300) == 0, log.read_text()[-4000:]

    text = log.read_text()
    assert "rank 0 of 2 consumes partitions [0, 2]" in text and "rank 1 of 2 consumes partitions [1]" in text, text
    alone, together = final_manifest(single), final_manifest(ranked)
    assert (together.samples_seen, together.sample_digest) == (6000, digest(samples))
    assert sorted((o["partition"], o["offset"]) for o in together.offsets) == \
        sorted((o["partition"], o["offset"]) for o in alone.offsets)
    assert sum(o["offset"] for o in together.offsets) == 6000
    # the same samples in other micro-batches (each rank polls half of one, as the records come): the
    # model's quality within noise of one process's, an AUC over the last 2,000 samples (0.043 seen once)
    assert together.metrics["auc"] > 0.6 and abs(together.metrics["auc"] - alone.metrics["auc"]) < 0.06


def test_a_rank_without_partitions_takes_part_in_every_round(settings: Settings, tmp_path: Path) -> None:
    s = settings_for(settings, tmp_path, "spare", partitions=2)
    samples = make_samples(3000)
    produce_samples(s, samples)
    log = tmp_path / "train.log"
    assert torchrun(s, log, 3, "--idle-exit", "3").wait(300) == 0, log.read_text()[-4000:]
    text = log.read_text()
    assert "rank 2 of 3 consumes partitions none" in text, text[-3000:]
    final = final_manifest(s)
    assert (final.samples_seen, final.sample_digest) == (3000, digest(samples))
    assert "rank 2 of 3: trained 3000 samples" in text


def rank_pids(launcher: subprocess.Popen) -> dict[int, int]:
    """RANK -> pid of torchrun's workers (its children that carry RANK in their environment)."""
    found: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            parent = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, StopIteration):
            continue
        if parent == launcher.pid:
            rank = next((v.split(b"=", 1)[1] for v in environ if v.startswith(b"RANK=")), None)
            if rank is not None:
                found[int(rank)] = int(entry.name)
    return found


def test_a_rank_killed_mid_run_loses_nothing_and_trains_nothing_twice(settings: Settings, tmp_path: Path) -> None:
    s = settings_for(settings, tmp_path, "killed")
    first, second = make_samples(4000), make_samples(4000, seed=1, start=4000)
    produce_samples(s, first)
    log = tmp_path / "train.log"
    launcher = torchrun(s, log, 2, "--idle-exit", "6", max_restarts=1)
    try:
        store = SnapshotStore(s.trainer.snapshot_dir)
        deadline = time.monotonic() + 180
        while not store.versions() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert store.versions(), log.read_text()[-3000:]
        victims = rank_pids(launcher)
        assert sorted(victims) == [0, 1], victims
        produce_samples(s, second)
        os.kill(victims[1], signal.SIGKILL)
        assert launcher.wait(300) == 0, log.read_text()[-4000:]
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    text = log.read_text()
    assert "resumed from snapshot" in text, text[-3000:]
    final = final_manifest(s)
    assert (final.samples_seen, final.sample_digest) == (8000, digest(first + second)), text[-3000:]
    assert sum(o["offset"] for o in final.offsets) == 8000


def agents(s: Settings, tmp_path: Path, count: int, *args: str) -> list[subprocess.Popen]:
    """`count` torchrun agents of one rank each in one c10d rendezvous, as on `count` machines."""
    endpoint, run_id = f"127.0.0.1:{free_port()}", f"rtrec-{tmp_path.name}"
    return [agent(s, tmp_path / f"agent-{k}.log", endpoint, run_id, str(count), *args) for k in range(count)]


def agent_logs(tmp_path: Path, tail: int | None = 4000) -> str:
    """The agents' logs, each cut to its last `tail` characters (None: whole)."""
    return "\n".join(p.read_text()[-tail if tail else 0:] for p in sorted(tmp_path.glob("agent-*.log")))


def test_ranks_of_two_agents_as_on_two_machines_lose_nothing_when_one_is_killed(
        settings: Settings, tmp_path: Path) -> None:
    """Two torchrun agents (as on two machines or pods) in one c10d rendezvous, one rank each: a rank
    killed with SIGKILL makes both agents restart their ranks in a new round, and they resume from the
    snapshot."""
    s = settings_for(settings, tmp_path, "agents")
    first, second = make_samples(4000), make_samples(4000, seed=1, start=4000)
    produce_samples(s, first)
    launchers = agents(s, tmp_path, 2, "--idle-exit", "6")
    try:
        store = SnapshotStore(s.trainer.snapshot_dir)
        deadline = time.monotonic() + 180
        while not store.versions() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert store.versions(), agent_logs(tmp_path)
        victims = rank_pids(launchers[1])
        assert len(victims) == 1, victims
        produce_samples(s, second)
        os.kill(next(iter(victims.values())), signal.SIGKILL)
        assert [p.wait(300) for p in launchers] == [0, 0], agent_logs(tmp_path)
    finally:
        for p in launchers:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    # whole logs: the tails (for the messages) can be filled by torch's warnings as the rendezvous closes
    text = agent_logs(tmp_path, None)
    assert text.count("resumed from snapshot") >= 2, agent_logs(tmp_path)  # both agents' new ranks
    final = final_manifest(s)
    assert (final.samples_seen, final.sample_digest) == (8000, digest(first + second)), agent_logs(tmp_path)
    assert sum(o["offset"] for o in final.offsets) == 8000


def agent(s: Settings, log: Path, endpoint: str, run_id: str, nodes: str, *args: str) -> subprocess.Popen:
    """One torchrun agent with the elastic trainer pods' arguments (scripts/k8s/elastic-trainer), in the
    rendezvous `run_id` at `endpoint` of `nodes` (MIN:MAX) instead of theirs."""
    ours = {"--rdzv-endpoint": endpoint, "--rdzv-id": run_id, "--nnodes": nodes}
    arguments = [f"{name}={ours[name]}" if (name := a.split("=")[0]) in ours else a for a in agent_arguments()]
    env = {**os.environ, **env_of(s), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *arguments, *args], cwd=ROOT, env=env,
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.parametrize("leaving", ["SIGTERM", "SIGKILL"])
def test_an_agent_joining_and_leaving_a_running_job_changes_its_ranks_and_loses_nothing(
        settings: Settings, tmp_path: Path, leaving: str) -> None:
    """Elastic membership, as pods of a scaled set come and go: one agent trains alone; a second agent
    joining makes both restart their ranks as two (from the snapshot); the second leaving leaves the first
    to go on as one rank. SIGTERM to the agent, as Kubernetes stops a pod: its rank stops with the round's
    snapshot and the other rank restarts (exit 75). SIGKILL of the agent and its rank, as a node is lost:
    the other rank fails and restarts from the last snapshot."""
    s = settings_for(settings, tmp_path, "elastic", snapshot_every_samples=1000)
    parts = [make_samples(3000, seed=k, start=3000 * k) for k in range(3)]
    endpoint, run_id = f"127.0.0.1:{free_port()}", f"rtrec-{tmp_path.name}"
    store = SnapshotStore(s.trainer.snapshot_dir)

    def wait_for(samples: int) -> None:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            version = store.latest_version()
            if version is not None and store.manifest(version).samples_seen >= samples:
                return
            time.sleep(0.2)
        raise AssertionError(f"no snapshot of {samples} samples\n{agent_logs(tmp_path)}")

    produce_samples(s, parts[0])
    first = agent(s, tmp_path / "agent-0.log", endpoint, run_id, "1:2", "--idle-exit", "20")
    second = None
    try:
        wait_for(3000)
        second = agent(s, tmp_path / "agent-1.log", endpoint, run_id, "1:2", "--idle-exit", "20")
        deadline = time.monotonic() + 180
        while "rank 1 of 2 consumes" not in agent_logs(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "rank 1 of 2 consumes" in agent_logs(tmp_path), agent_logs(tmp_path)
        produce_samples(s, parts[1])
        wait_for(5000)  # trained by the two ranks (a snapshot every 1,000 samples), not their idle exit's
        if leaving == "SIGTERM":
            second.send_signal(signal.SIGTERM)  # to the agent alone, which stops its rank
        else:
            rank = rank_pids(second)  # its own session: the agent's process group does not hold it
            assert len(rank) == 1, rank
            os.killpg(second.pid, signal.SIGKILL)
            os.kill(next(iter(rank.values())), signal.SIGKILL)
        second.wait(60)
        produce_samples(s, parts[2])
        assert first.wait(300) == 0, agent_logs(tmp_path)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    text = agent_logs(tmp_path)
    final = final_manifest(s)
    assert (final.samples_seen, final.sample_digest) == (9000, digest(parts[0] + parts[1] + parts[2])), text
    assert sum(o["offset"] for o in final.offsets) == 9000
    # the first agent's ranks: one, two once the second joined, and one again (a single process) once it left
    first_log = (tmp_path / "agent-0.log").read_text()
    assert first_log.index("started fresh") < first_log.index("rank 0 of 2 consumes"), text
    alone_again = first_log[first_log.rindex("rank 0 of 2 consumes"):]
    assert "resumed from snapshot" in alone_again and "\ntrained 9000 samples" in alone_again, text
