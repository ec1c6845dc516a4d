"""The trainer service's logic with in-memory I/O (tests/gpu_trainer/fakes.py): no broker, no Redis.
The same service against Kafka and Redis: test_service_kafka.py."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

from core.settings import TrainerSettings
from gpu_trainer import snapshots
from gpu_trainer.batch import Columns
from gpu_trainer.distributed import Agreed, Round, combine
from gpu_trainer.service import RanksChanged, TrainerService
from gpu_trainer.snapshots import SnapshotStore
from schemas.dead_letter import Reject
from schemas.kafka_io import ConsumedBatch
from tests.gpu_trainer.fakes import TOPIC, ListOutputs, ListSource, MemoryPointer
from tests.gpu_trainer.samples import digest, make_samples
from tests.gpu_trainer.snapshot_damage import DAMAGE, changed_bytes


def config(tmp_path: Path, **kw: object) -> TrainerSettings:
    return TrainerSettings(**{"snapshot_dir": tmp_path / "snapshots", "user_buckets": 4096, "item_buckets": 4096,
                              "batch_size": 200, "batch_timeout_ms": 0, "lr": 0.05, "dense_lr": 0.05,
                              "snapshot_every_samples": 1000, "snapshot_every_s": 3600.0, "eval_window": 2000,
                              **kw})


def service(cfg: TrainerSettings, source: ListSource, pointer: MemoryPointer | None = None,
            outputs: ListOutputs | None = None) -> TrainerService:
    return TrainerService(cfg, source, outputs or ListOutputs(), pointer or MemoryPointer(),
                          SnapshotStore(cfg.snapshot_dir))


def test_trains_every_sample_once_and_dead_letters_the_rest(tmp_path: Path) -> None:
    good = make_samples(3000)
    bad = [dict(make_samples(1, start=9000)[0], features=[math.nan] * 20),
           dict(make_samples(1, start=9001)[0], features=[1.0, 2.0]),
           dict(make_samples(1, start=9002)[0], label=3)]
    source = ListSource({0: good[:1500] + bad[:2], 1: [Reject("undecodable", value=b"\x00")] + good[1500:] + bad[2:]})
    outputs, pointer = ListOutputs(), MemoryPointer()
    trainer = service(config(tmp_path), source, pointer, outputs)
    summary = trainer.run(should_stop=lambda: source.lag() == 0)

    assert summary.samples_trained == 3000 and summary.dead_lettered == 4
    last = trainer.store.manifest(trainer.store.latest_version())
    assert last.sample_digest == digest(good)
    assert {(o["partition"], o["offset"]) for o in last.offsets} == {(0, 1502), (1, 1502)}
    reasons = sorted(r.reason for r in outputs.dead)
    assert any("s9000" in r and "non-finite" in r for r in reasons)
    assert any("expected 20 features, got 2" in r for r in reasons)
    assert any("s9002" in r and "label 3" in r for r in reasons)
    assert any(r == "undecodable" for r in reasons)
    assert [a["version"] for a in outputs.announced] == summary.snapshots
    assert pointer.current == summary.promoted[-1]
    assert source.commits[-1] == {(TOPIC, 0): 1502, (TOPIC, 1): 1502} and source.closed


def test_restart_resumes_from_the_snapshot_offsets(tmp_path: Path) -> None:
    cfg, samples = config(tmp_path), make_samples(4000)
    partitions = {0: samples[:2000], 1: samples[2000:]}
    first = service(cfg, ListSource(partitions)).run(max_samples=1000)
    assert 1000 <= first.samples_trained < 4000

    source = ListSource(partitions)
    second = service(cfg, source)
    assert second.resume() == first.snapshots[-1]
    summary = second.run(should_stop=lambda: source.lag() == 0)
    assert source.started_at == SnapshotStore(cfg.snapshot_dir).manifest(first.snapshots[-1]).offsets_by_partition()
    assert summary.samples_trained == 4000
    store = SnapshotStore(cfg.snapshot_dir)
    assert store.manifest(store.latest_version()).sample_digest == digest(samples)


def test_checkpoint_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = service(config(tmp_path), ListSource({0: []}))
    calls: list[str] = []
    for obj, name, label in [(trainer.store, "write", "snapshot files"), (trainer.outputs, "announce", "announcement"),
                             (trainer.pointer, "set_current", "pointer"),
                             (trainer.learner, "consolidate", "ewc consolidate"),
                             (trainer.source, "commit", "offsets commit"), (trainer.store, "prune", "prune")]:
        real = getattr(obj, name)
        monkeypatch.setattr(obj, name, lambda *a, _real=real, _label=label, **k: (calls.append(_label),
                                                                                  _real(*a, **k))[1])
    trainer.positions = {(TOPIC, 0): 0}
    assert trainer.checkpoint().promoted
    trainer.publisher.finish()
    assert calls == ["ewc consolidate", "snapshot files", "announcement", "pointer", "offsets commit", "prune"]


def test_each_snapshot_holds_the_state_of_its_checkpoint_though_copies_are_reused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint refills the previous snapshot's copy of the state: only once that snapshot is
    written, however long its writing takes while training goes on."""
    trainer = service(config(tmp_path), ListSource({0: []}))
    write = trainer.store.write
    monkeypatch.setattr(trainer.store, "write", lambda *a: (time.sleep(0.3), write(*a))[1])  # a slow disk
    cfg, trainer.positions = trainer.cfg, {(TOPIC, 0): 0}
    expected, copies = [], []
    for k in range(3):
        batch = Columns.from_records(make_samples(500, start=500 * k)).to_batch(cfg.user_buckets, cfg.item_buckets)
        trainer.learner.step(batch)
        expected.append({name: array.copy() for name, array in trainer.learner.state_arrays().items()})
        assert trainer.checkpoint() is not None
        copies.append(dict(trainer._snapshot_copy))
        trainer.learner.step(batch)  # training goes on while the snapshot is written
    trainer.publisher.finish()

    assert trainer.store.versions() == [1, 2, 3]
    for version, state in zip([1, 2, 3], expected, strict=True):
        _, written = trainer.store.load(version)
        assert written.keys() == state.keys()
        for name, array in state.items():
            np.testing.assert_array_equal(written[name], array, err_msg=f"v{version} {name}")
    assert all(copies[2][name] is copies[0][name] for name in copies[0])


def test_a_snapshot_due_while_the_last_is_written_waits_for_it_and_training_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk slower than training: v1's write is held until every sample was polled. Training does
    not wait for it; the snapshots due meanwhile (every 1,000 samples) wait instead, and the next one
    holds every sample trained since: nothing lost, nothing twice."""
    cfg, samples = config(tmp_path), make_samples(6000)
    source = ListSource({0: samples})
    trainer = service(cfg, source)
    write, trained_while_writing = trainer.store.write, []

    def slow_write(manifest: snapshots.Manifest, arrays: dict[str, np.ndarray]) -> Path:
        before, deadline = trainer.learner.samples_trained, time.monotonic() + 60
        while manifest.version == 1 and source.lag() and time.monotonic() < deadline:
            time.sleep(0.01)
        trained_while_writing.append(trainer.learner.samples_trained - before)
        return write(manifest, arrays)

    monkeypatch.setattr(trainer.store, "write", slow_write)
    summary = trainer.run(should_stop=lambda: source.lag() == 0)
    assert summary.samples_trained == 6000 and summary.snapshots == [1, 2]
    assert [trainer.store.manifest(v).samples_seen for v in summary.snapshots] == [1000, 6000]
    assert trained_while_writing[0] >= 4800  # all but the last batch, at least, while v1 was being written
    final = trainer.store.manifest(2)
    assert final.sample_digest == digest(samples) and final.offsets_by_partition() == {(TOPIC, 0): 6000}


def test_an_idle_trainer_commits_its_last_snapshots_offsets(tmp_path: Path) -> None:
    """Lag tools (and the autoscaler) read the group's committed offsets: once the samples stop, the
    last snapshot's offsets are committed while the trainer waits for more, not at the next snapshot."""
    source = ListSource({0: make_samples(1000)})
    trainer = service(config(tmp_path), source)
    deadline = time.monotonic() + 30
    trainer.run(should_stop=lambda: bool(source.commits) or time.monotonic() > deadline)
    assert time.monotonic() < deadline, "no commit while idle"
    assert source.commits == [{(TOPIC, 0): 1000}] and trainer.written == [1]


def _scores(prequential: object, auc_wanted: float, n: int = 1000) -> None:
    """Feeds `n` scored samples whose AUC is about `auc_wanted` (scores = label mixed with noise)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, n).astype(np.float64)
    noise = rng.random(n)
    mix = 2 * (auc_wanted - 0.5)  # 0: pure noise (0.5), 1: the label itself (1.0)
    prequential.update(np.where(rng.random(n) < mix, labels, noise), labels)  # type: ignore[attr-defined]


def test_the_gate_judges_the_weights_it_publishes(tmp_path: Path) -> None:
    """The trained weights score well, the published (EMA) ones badly: the snapshot of those published
    weights must not replace a better current one, whatever the trained weights' AUC."""
    trainer = service(config(tmp_path, promotion_margin=0.02, ema_enabled=True), ListSource({0: []}))
    learner = trainer.learner
    assert learner.published_prequential is not learner.prequential  # EMA on: two sets of scores
    _scores(learner.published_prequential, 0.80)
    _scores(learner.prequential, 0.80)
    trainer.positions = {(TOPIC, 0): 0}
    first = trainer.checkpoint()
    assert first is not None and first.promoted
    trainer.publisher.finish()

    learner.published_prequential = type(learner.published_prequential)(learner.cfg.eval_window)
    learner.prequential = type(learner.prequential)(learner.cfg.eval_window)
    _scores(learner.published_prequential, 0.60)
    _scores(learner.prequential, 0.95)
    second = trainer.checkpoint()
    trainer.publisher.finish()
    assert second is not None and not second.promoted
    assert second.metrics["auc"] == pytest.approx(learner.published_prequential.auc())
    assert second.metrics["trained_auc"] == pytest.approx(learner.prequential.auc())
    assert second.metrics["trained_auc"] > first.metrics["auc"] > second.metrics["auc"]
    assert trainer.pointer.current_version() == first.version


def test_published_scores_come_from_the_published_weights(tmp_path: Path) -> None:
    """With a slow EMA the published weights are not the trained ones, and neither are their scores."""
    cfg = config(tmp_path, ema_enabled=True, ema_momentum=0.999)
    source = ListSource({0: make_samples(4000)})
    trainer = service(cfg, source)
    trainer.run(should_stop=lambda: source.lag() == 0)
    last = trainer.store.manifest(trainer.store.latest_version())
    assert abs(last.metrics["trained_auc"] - last.metrics["auc"]) > 0.005
    assert last.metrics["auc"] == pytest.approx(trainer.learner.published_prequential.auc())


def test_without_ema_the_published_weights_are_the_trained_ones(tmp_path: Path) -> None:
    source = ListSource({0: make_samples(1200)})
    trainer = service(config(tmp_path, ema_enabled=False), source)
    trainer.run(should_stop=lambda: source.lag() == 0)
    assert trainer.learner.published_prequential is trainer.learner.prequential
    last = trainer.store.manifest(trainer.store.latest_version())
    assert last.metrics["auc"] == last.metrics["trained_auc"]


def test_one_over_long_sample_costs_one_dead_letter_not_the_batch(tmp_path: Path) -> None:
    good = make_samples(1000)
    poison = dict(make_samples(1, start=5000)[0], features=[1.0] * 50)
    source = ListSource({0: good[:500] + [poison] + good[500:]})
    outputs = ListOutputs()
    trainer = service(config(tmp_path), source, outputs=outputs)
    summary = trainer.run(should_stop=lambda: source.lag() == 0)
    assert summary.samples_trained == 1000 and summary.dead_lettered == 1
    assert [r.reason for r in outputs.dead] == ["sample s5000: expected 20 features, got 50"]


def test_ids_that_are_empty_or_too_long_are_refused(tmp_path: Path) -> None:
    good = make_samples(300)
    bad = [dict(make_samples(1, start=7000)[0], user_id=""), dict(make_samples(1, start=7001)[0], item_id="i" * 300)]
    source = ListSource({0: good + bad})
    outputs = ListOutputs()
    summary = service(config(tmp_path, max_id_length=256), source, outputs=outputs).run(
        should_stop=lambda: source.lag() == 0)
    assert summary.samples_trained == 300
    assert [r.key for r in outputs.dead] == [b"sample:s7000", b"sample:s7001"]
    assert all("an id is empty or longer than 256 characters" in r.reason for r in outputs.dead)


def test_what_was_dead_lettered_before_a_restart_is_counted_but_not_written_again(tmp_path: Path) -> None:
    """A restart reads again what came after its snapshot: the dead letters those records got before
    the crash exist already (the outputs know their keys), so only their count is rebuilt."""
    good = make_samples(600)
    poison = dict(make_samples(1, start=8000)[0], label=5)
    outputs = ListOutputs()
    outputs.dead_letter([Reject("sample s8000: label 5.0 is not 0 or 1", TOPIC, key=b"sample:s8000"),
                         Reject("undecodable", TOPIC, 0, 301, key=f"{TOPIC}:0:301".encode())])
    source = ListSource({0: good[:300] + [poison, Reject("undecodable", value=b"\x00")] + good[300:]})
    summary = service(config(tmp_path), source, outputs=outputs).run(should_stop=lambda: source.lag() == 0)
    assert summary.samples_trained == 600 and summary.dead_lettered == 2
    assert len(outputs.dead) == 2  # the two written before the "crash", none again


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_newest_snapshot_falls_back_to_the_newest_intact_one(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    cfg, samples = config(tmp_path), make_samples(3000)
    first = service(cfg, ListSource({0: samples[:2000]}))
    first.run(should_stop=lambda: first.source.lag() == 0)  # type: ignore[attr-defined]
    store = SnapshotStore(cfg.snapshot_dir)
    newest, previous = store.versions()[-1], store.versions()[-2]
    apply, reason = DAMAGE[damage]
    apply(store, newest)

    source = ListSource({0: samples})
    second = service(cfg, source)
    with caplog.at_level("WARNING", logger="rtrec.trainer"):
        assert second.resume() == previous
    said = caplog.text
    assert f"cannot resume from snapshot v{newest}" in said and reason in said
    assert f"resumed from v{previous}, the newest intact snapshot" in said
    summary = second.run(should_stop=lambda: source.lag() == 0)
    assert summary.samples_trained == 3000  # what v{newest} held is trained again from v{previous}'s offsets
    assert store.manifest(store.latest_version()).sample_digest == digest(samples)
    assert min(summary.snapshots) == newest + 1  # the damaged one keeps its number


def test_no_intact_snapshot_starts_from_scratch_and_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = config(tmp_path)
    first = service(cfg, ListSource({0: make_samples(1200)}))
    first.run(should_stop=lambda: first.source.lag() == 0)  # type: ignore[attr-defined]
    store = SnapshotStore(cfg.snapshot_dir)
    for v in store.versions():
        changed_bytes(store, v)
    with caplog.at_level("WARNING", logger="rtrec.trainer"):
        assert service(cfg, ListSource({0: []})).resume() is None
    assert "no intact snapshot: training starts from scratch" in caplog.text


def test_a_full_disk_leaves_no_debris_and_training_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """The second snapshot meets a full disk halfway through its weights (tests/faults does it on a
    real full filesystem); the half-written directory goes, training goes on, the next one succeeds."""
    cfg, samples = config(tmp_path), make_samples(6000)  # v2 fails well before the last (final) snapshot
    source = ListSource({0: samples})
    trainer = service(cfg, source)
    real_savez, calls = np.savez, []

    def full_once(file: object, **arrays: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            file.write(b"partial")  # type: ignore[attr-defined]
            raise OSError(28, "No space left on device")
        real_savez(file, **arrays)

    monkeypatch.setattr(snapshots.np, "savez", full_once)
    with caplog.at_level("ERROR", logger="rtrec.trainer"):
        summary = trainer.run(should_stop=lambda: source.lag() == 0)
    assert "snapshot v2 was not written" in caplog.text and "No space left on device" in caplog.text
    assert trainer.publisher.failures == 1 and summary.samples_trained == 6000
    # v2 is the number the failed one would have had (how many follow depends on the disk's pace)
    assert summary.snapshots == list(range(1, len(summary.snapshots) + 1)) and len(summary.snapshots) >= 2
    assert sorted(p.name for p in cfg.snapshot_dir.iterdir()) == [f"v{v:06d}" for v in summary.snapshots]  # no .tmp-*
    assert trainer.store.manifest(summary.snapshots[-1]).sample_digest == digest(samples)


def test_a_snapshot_that_failed_while_idle_is_written_again_without_new_samples(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its samples are in no snapshot: the trainer writes the next one when it is due by the clock,
    and commits its offsets, while still waiting for samples."""
    source = ListSource({0: make_samples(1000)})
    trainer = service(config(tmp_path, snapshot_every_s=0.5), source)
    real_savez, calls = np.savez, []

    def full_once(file: object, **arrays: object) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        real_savez(file, **arrays)

    monkeypatch.setattr(snapshots.np, "savez", full_once)
    deadline = time.monotonic() + 30
    trainer.run(should_stop=lambda: bool(source.commits) or time.monotonic() > deadline)
    assert time.monotonic() < deadline, "the failed snapshot was not written again while idle"
    assert trainer.publisher.failures == 1 and trainer.written == [1]  # nothing took the failed one's number
    assert trainer.store.manifest(1).sample_digest == digest(make_samples(1000))
    assert source.commits == [{(TOPIC, 0): 1000}]


def test_interrupted_writes_are_swept_at_start(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    debris = cfg.snapshot_dir / ".tmp-v000007-4242"
    debris.mkdir(parents=True)
    (debris / "weights.npz").write_bytes(b"x" * 1000)
    service(cfg, ListSource({0: []})).resume()
    assert not debris.exists()


class _TimedSource(ListSource):
    def __init__(self, partitions: dict[int, list[dict]]) -> None:
        super().__init__(partitions)
        self.timeouts: list[float] = []

    def poll(self, max_records: int, timeout_s: float) -> ConsumedBatch:
        self.timeouts.append(timeout_s)
        return super().poll(max_records, timeout_s)


class _PairedRanks:
    """Rank 0 of two, the other rank's part of each round scripted: a backlog in its first
    `behind_rounds` rounds, nothing polled, stopping when rank 0 does."""

    rank, world, leader = 0, 2, True

    def __init__(self, behind_rounds: int) -> None:
        self.round = 0
        self.behind_rounds = behind_rounds

    def exchange(self, mine: Round) -> Agreed:
        self.round += 1
        other = Round(mine.batch.head(0), {}, 0, 0.0, mine.stop, behind=self.round <= self.behind_rounds)
        return combine([mine, other])

    def from_leader(self, value: object) -> object:
        return value

    def same_weights(self, arrays: object) -> bool:
        return True


def test_a_rank_that_caught_up_does_not_hold_the_others_backlog_by_its_timeout(tmp_path: Path) -> None:
    """Rank 0 polls its 300 samples in three rounds, each waiting up to the batch timeout; then, while the
    other rank still has a backlog (rounds 1-5), it takes what has arrived without waiting; once none
    has, it waits again."""
    cfg = config(tmp_path, batch_timeout_ms=50)
    source = _TimedSource({0: make_samples(300)})
    trainer = TrainerService(cfg, source, ListOutputs(), MemoryPointer(), SnapshotStore(cfg.snapshot_dir),
                             ranks=_PairedRanks(behind_rounds=5))  # type: ignore[arg-type]
    summary = trainer.run(should_stop=lambda: len(source.timeouts) >= 7)
    assert source.timeouts == [0.05, 0.05, 0.05, 0.0, 0.0, 0.0, 0.05]
    assert summary.samples_trained == 300


class _StoppingPeer(_PairedRanks):
    """Rank 0 of two whose other rank asks to stop in round `stop_at`. With `signalled`, this rank's own
    SIGTERM arrives during that round's exchange, after it polled: as torchrun passes one SIGTERM to
    each of its ranks a moment apart."""

    def __init__(self, stop_at: int, signalled: bool) -> None:
        super().__init__(behind_rounds=0)
        self.stop_at, self.signalled, self.asked_to_stop = stop_at, signalled, False

    def exchange(self, mine: Round) -> Agreed:
        self.round += 1
        stops = self.round >= self.stop_at
        self.asked_to_stop = self.asked_to_stop or (stops and self.signalled)
        return combine([mine, Round(mine.batch.head(0), {}, 0, 0.0, stops)])


@pytest.mark.parametrize("signalled", [False, True])
def test_a_rank_left_behind_by_the_others_stopping_ends_for_a_restart_unless_it_was_asked_to_stop_too(
        tmp_path: Path, signalled: bool) -> None:
    cfg = config(tmp_path, batch_timeout_ms=10)  # two ranks: 100 samples each polls a round
    peer = _StoppingPeer(stop_at=2, signalled=signalled)
    trainer = TrainerService(cfg, ListSource({0: make_samples(300)}), ListOutputs(), MemoryPointer(),
                             SnapshotStore(cfg.snapshot_dir), ranks=peer)  # type: ignore[arg-type]
    if signalled:  # stopping with the others: a clean end
        assert trainer.run(should_stop=lambda: peer.asked_to_stop).samples_trained == 200
    else:  # a scale-down: this rank ends so that torchrun restarts it in the smaller membership
        with pytest.raises(RanksChanged, match="other ranks stopped"):
            trainer.run(should_stop=lambda: peer.asked_to_stop)
    # either way the round the others stopped in is trained and in the final snapshot
    store = SnapshotStore(cfg.snapshot_dir)
    assert store.manifest(store.latest_version()).samples_seen == 200
