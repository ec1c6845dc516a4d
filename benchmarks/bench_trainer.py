"""Trainer figures: samples/s per model and batch size (this machine's device), and end-to-end
freshness, event time -> first promoted snapshot containing the sample, through a real broker.

Run: `.venv/bin/python -m benchmarks.bench_trainer [--seconds 15] [--rate 20000] [--only service|ranks|sharding]
[--samples N] [--samples-per-message N]`.
Writes `benchmarks/out/trainer_freshness.png`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from benchmarks.common import emit
from benchmarks.run_data import remove_runs, tracked
from core.collector import cyclic_gc_paused
from core.kafka import consumer_config, poll_messages, producer_config
from core.settings import Settings, TrainerSettings, load_settings
from gpu_trainer.batch import Columns
from gpu_trainer.kafka_adapters import fetch_properties
from gpu_trainer.learner import Learner
from gpu_trainer.service import TrainerService, make_learner
from gpu_trainer.snapshots import SnapshotStore
from schemas.kafka_io import AvroProducer
from schemas.serde import deserializer, header_of
from tests.gpu_trainer.samples import make_samples, produce_samples

OUT = Path(__file__).parent / "out"


def throughput(models: list[str], batch_sizes: list[int], seconds: float) -> None:
    pool = make_samples(65_536, seed=3)
    for model in models:
        for bs in batch_sizes:
            learner = Learner(TrainerSettings(model=model, embedding_dim=32 if model == "mf" else 16), n_dense=20)
            batches = [Columns.from_records(pool[k:k + bs]).to_batch(learner.cfg.user_buckets,
                                                                       learner.cfg.item_buckets)
                       for k in range(0, len(pool) - bs + 1, bs)][:8]
            learner.step(batches[0])  # warm-up
            done, began = 0, time.perf_counter()
            while time.perf_counter() - began < seconds:
                for b in batches:
                    learner.step(b)
                    done += len(b)
            rate = done / (time.perf_counter() - began)
            emit("trainer", f"samples_per_s_{model}_b{bs}", rate, "samples/s", done, device=str(learner.device))


def shadow_cost(variant_sets: list[tuple[str, ...]], bs: int, seconds: float) -> None:
    """Samples/s of the MF step with k shadow learners against one rule (batch `bs`)."""
    pool = make_samples(65_536, seed=3)
    for variants in variant_sets:
        cfg = TrainerSettings(shadow_variants=variants)
        learner = make_learner(cfg, 20)
        batches = [Columns.from_records(pool[k:k + bs]).to_batch(cfg.user_buckets, cfg.item_buckets)
                   for k in range(0, len(pool) - bs + 1, bs)][:8]
        learner.step(batches[0])
        done, began = 0, time.perf_counter()
        while time.perf_counter() - began < seconds:
            for b in batches:
                learner.step(b)
                done += len(b)
        name = "+".join(variants) if variants else "one_rule"
        emit("trainer", f"samples_per_s_shadow_{len(variants) or 1}_{name}_b{bs}", done / (time.perf_counter() - began),
             "samples/s", done)


@contextlib.contextmanager
def services(settings: Settings, own: bool) -> Iterator[Settings]:
    """The configured services, or (`own`) fresh ones for the benchmark; on the configured ones, the
    isolated runs' data is removed at the end (benchmarks.run_data), on fresh ones it goes with them."""
    if not own:
        try:
            yield settings
        finally:
            remove_runs()
        return
    from tests.infra import local_processes

    with tempfile.TemporaryDirectory() as tmp, local_processes(Path(tmp)) as ep:
        try:
            yield settings.model_copy(update={
                "kafka": settings.kafka.model_copy(update={"bootstrap_servers": ep.kafka_bootstrap}),
                "redis": settings.redis.model_copy(update={"url": ep.redis_url})})
        finally:
            remove_runs(on_services=False)


def sample_positions(bootstrap: str, topic: str) -> list[tuple[int, int, int]]:
    """(partition, offset, event_time) of every sample in the topic."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-reader", "enable.auto.commit": False})
    decode = deserializer("TrainingSample")
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    out, seen = [], dict.fromkeys(parts, 0)
    while any(seen[p] < ends[p] for p in parts):
        for msg in consumer.consume(10_000, timeout=1.0):
            if msg.error():
                continue
            out.append((msg.partition(), msg.offset(), decode(msg.value(), header_of(msg.headers()))["event_time"]))
            seen[msg.partition()] = msg.offset() + 1
    consumer.close()
    return out


def isolated(settings: Settings, **trainer: object) -> Settings:
    run_id, snapshots = f"bench{uuid.uuid4().hex[:8]}", Path(tempfile.mkdtemp())
    s = settings.namespaced(run_id)
    trainer_settings = s.trainer.model_copy(update={"snapshot_dir": snapshots, **trainer})
    return tracked(s.model_copy(update={"trainer": trainer_settings}), run_id, snapshots)


# whole batches of 4,096: a last partial batch would wait out the batch timeout, which a live stream never does.
# 245 of them: runs of 49 lasted about 2 s, of which the service's start (the group join, the first
# snapshot's copy into fresh memory) and its final snapshot took a third and more
SERVICE_SAMPLES = 245 * 4096


def service_throughput(settings: Settings, n: int, repeats: int = 1, per_message: int = 1) -> None:
    """Samples/s of the whole service (consume, decode, validate, train, snapshot) from a backlog:
    the median of `repeats` runs over the same topic, each a new consumer group and snapshot
    directory (the broker shares this machine's cores: single runs vary by ±15 %). `per_message`:
    samples per message (flink.samples_per_message), blocks of them when above 1."""
    s = isolated(settings, batch_size=4096, snapshot_every_samples=100_000, snapshot_every_s=60.0)
    samples = make_samples(n, seed=9)
    produce_samples(s, samples, per_message)
    print(f"samples per message: {per_message}", file=sys.stderr)
    rates = []
    for run in range(repeats):
        print(f"service run {run + 1} of {repeats} over {n} samples", file=sys.stderr)
        with tempfile.TemporaryDirectory() as snapshots:  # a run writes about 150 MB of them
            trainer = s.trainer.model_copy(update={"group_id": f"{s.trainer.group_id}-{run}",
                                                   "snapshot_dir": Path(snapshots)})
            service = TrainerService.from_settings(s.model_copy(update={"trainer": trainer}))
            began = time.perf_counter()
            # it stops on its n-th sample, after the final snapshot: stopping on idleness would count the
            # wait that detects it (2 s and up to one batch timeout more)
            summary = service.run(max_samples=n, idle_exit_s=10.0)
            took = time.perf_counter() - began
        if summary.samples_trained != n:
            raise RuntimeError(f"the service trained {summary.samples_trained} of {n} samples")
        rates.append(summary.samples_trained / took)
    rate = float(np.median(rates))
    emit("trainer", "service_samples_per_s_mf_b4096", rate, "samples/s", n,
         runs=[round(r) for r in rates], samples_per_message=per_message)
    step_rate = step_throughput(s.trainer, samples, repeats)
    emit("trainer", "service_to_step_ratio", rate / step_rate, "ratio", summary.samples_trained,
         samples_per_message=per_message)
    # consuming the messages alone bounds the service, whatever its decoding costs
    messages = -(-n // per_message)
    consumed = float(np.median([consume_only(s, messages, f"{s.trainer.group_id}-consume-{k}")
                                for k in range(repeats)]))
    emit("trainer", "consume_only_messages_per_s", consumed, "messages/s", messages,
         samples_per_message=per_message)
    emit("trainer", "consume_and_step_ratio_ceiling", consumed * per_message / (consumed * per_message + step_rate),
         "ratio", n, samples_per_message=per_message)


def step_throughput(trainer: TrainerSettings, samples: list[dict[str, object]], repeats: int) -> float:
    """The service's learner's training step alone on the same samples in the same batches: the median
    of `repeats` passes after one step, whose time (the optimizer's state, allocated on the first
    step) is reported on its own, as it made single passes spread by ±30 %."""
    learner = make_learner(trainer, 20)
    batches = [Columns.from_records(samples[k:k + 4096]).to_batch(trainer.user_buckets, trainer.item_buckets)
               for k in range(0, len(samples), 4096)]
    began = time.perf_counter()
    learner.step(batches[0])
    emit("trainer", "first_step_ms_mf_b4096", 1000 * (time.perf_counter() - began), "ms", len(batches[0]))
    rates = []
    for _ in range(repeats):
        began = time.perf_counter()
        for b in batches:
            learner.step(b)
        rates.append(len(samples) / (time.perf_counter() - began))
    step_rate = float(np.median(rates))
    emit("trainer", "step_samples_per_s_mf_b4096", step_rate, "samples/s", len(samples),
         runs=[round(r) for r in rates])
    return step_rate


def consume_only(settings: Settings, n: int, group_id: str) -> float:
    """Messages/s of a consumer configured as the service's (its read-ahead, read_committed) taking each
    message's value and headers from the samples topic's backlog, polled and paused as the service's
    polls are (core.kafka.poll_messages), and nothing else: from its first message to its `n`-th."""
    s = settings
    config = {**fetch_properties(s.trainer), **s.kafka.security.librdkafka()}
    consumer = Consumer(consumer_config(s.kafka.bootstrap_servers, group_id, "read_committed", "earliest", **config))
    topic = s.kafka.topics.samples
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    try:
        got, began = 0, None
        deadline = time.monotonic() + 120
        while got < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"consumed {got} of {n} samples in 120 s")
            with cyclic_gc_paused() as pause:
                messages = poll_messages(consumer, 4096, 1.0, fill=True, pause=pause)
                if began is None and messages:
                    began = time.perf_counter()
                values, headers = list(map(Message.value, messages)), list(map(Message.headers, messages))
                got += len(messages)
                del messages, values, headers
        return n / (time.perf_counter() - (began or 0.0))
    finally:
        consumer.close()


def ranks_throughput(settings: Settings, n: int, rank_counts: list[int], partitions: int = 6,
                     exchange: str = "samples") -> None:
    """Samples/s of the service as 1, 2, 3 torchrun ranks from a backlog (gpu_trainer.distributed), from
    the ranks' start (after torch's import and the rendezvous) to the snapshot taken in the round that
    trained the last sample (snapshots are due every `n` samples, so that is the first), not to the idle
    exit's, which comes up to one batch timeout plus the idle time later; the ranks exchanging `exchange`
    (trainer.rank_exchange)."""
    import os
    import re
    import subprocess
    from datetime import datetime

    from core.kafka import ensure_topics
    from tests.faults.runs import ROOT, env_of

    idle_s = 2.0
    for ranks in rank_counts:
        s = isolated(settings, batch_size=4096, snapshot_every_samples=n, snapshot_every_s=600.0,
                     rank_exchange=exchange)
        ensure_topics(s.kafka.bootstrap_servers, [s.kafka.topics.samples], partitions)
        produce_samples(s, make_samples(n, seed=9))
        print(f"ranks {ranks} ({exchange}): training {n} samples from {partitions} partitions", file=sys.stderr,
              flush=True)
        env = {**os.environ, **env_of(s), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc-per-node={ranks}", "-m", "rtrec", "train", "run", "--idle-exit", str(idle_s)],
                              cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
        log = done.stdout + done.stderr
        starts = [datetime.strptime(m, "%Y-%m-%d %H:%M:%S,%f").timestamp()
                  for m in re.findall(r"^(\S+ \S+) rtrec.trainer (?:rank \d+ of \d+ consumes|consuming)", log, re.M)]
        store = SnapshotStore(s.trainer.snapshot_dir)
        final = store.manifest(store.versions()[0])
        if final.samples_seen != n:
            raise RuntimeError(f"the first snapshot has {final.samples_seen} samples, not all {n}")
        took = final.created_at / 1000 - min(starts)
        suffix = "" if exchange == "samples" else f"_{exchange}"
        emit("trainer", f"service_samples_per_s_mf_b4096_ranks{ranks}{suffix}", final.samples_seen / took,
             "samples/s", final.samples_seen)
        emit("trainer", f"ingest_samples_per_s_per_rank_ranks{ranks}{suffix}", final.samples_seen / took / ranks,
             "samples/s", final.samples_seen)


def produce_paced(bootstrap: str, topic: str, rate: float, seconds: float,
                  results: multiprocessing.Queue[tuple[int, float]]) -> None:
    """Produces samples stamped with the time they are sent, `rate` per second for `seconds`, in
    chunks of 1/20 s; puts (samples sent, seconds taken) on `results`."""
    chunk = max(1, int(rate / 20))
    pool = make_samples(int(rate * seconds) + chunk, seed=5)
    producer = AvroProducer(producer_config(bootstrap, linger_ms=5), topic, "TrainingSample")
    began, sent = time.monotonic(), 0
    while time.monotonic() - began < seconds and sent + chunk <= len(pool):
        now = int(time.time() * 1000)
        for sample in pool[sent:sent + chunk]:
            sample["event_time"] = now
            producer.produce(sample, key=sample["user_id"])
        producer.flush()
        sent += chunk
        time.sleep(max(0.0, sent / rate - (time.monotonic() - began)))
    results.put((sent, time.monotonic() - began))


def freshness(settings: Settings, seconds: float, rate: float) -> None:
    s = isolated(settings, snapshot_every_s=1.0, snapshot_every_samples=10**9, batch_timeout_ms=100,
                 keep_last=10**6, promotion_margin=1.0)
    topics = s.kafka.topics
    produce_samples(s, make_samples(1, start=10**9))  # topic exists before the trainer subscribes
    stop = threading.Event()
    service = TrainerService.from_settings(s)
    trainer = threading.Thread(target=lambda: service.run(should_stop=stop.is_set))
    trainer.start()
    time.sleep(3)
    run_started_ms = int(time.time() * 1000)
    print(f"producing {rate:.0f} samples/s for {seconds:.0f}s", file=sys.stderr)
    # in a process of its own: on the trainer's interpreter the producer's encoding shared one GIL with
    # training and reached 11.5k of 20k samples/s asked
    results: multiprocessing.Queue[tuple[int, float]] = multiprocessing.get_context("spawn").Queue()
    producer = multiprocessing.get_context("spawn").Process(
        target=produce_paced, args=(s.kafka.bootstrap_servers, topics.samples, rate, seconds, results))
    producer.start()
    try:
        sent, took = results.get(timeout=seconds + 300)
    finally:  # a producer that never reports is not left behind
        producer.join(timeout=10)
        if producer.is_alive():
            producer.terminate()
    emit("trainer", "freshness_run_produced_rate", sent / took, "samples/s", sent)
    time.sleep(3)
    stop.set()
    trainer.join()
    store = SnapshotStore(s.trainer.snapshot_dir)
    promoted = [store.manifest(v) for v in store.versions() if store.manifest(v).promoted]
    print(f"{len(store.versions())} snapshots, {len(promoted)} promoted, last holds "
          f"{store.manifest(store.versions()[-1]).samples_seen} samples", file=sys.stderr)
    latencies = []
    for partition, offset, event_ms in sample_positions(s.kafka.bootstrap_servers, topics.samples):
        if event_ms < run_started_ms:  # the sample that created the topic
            continue
        for m in promoted:
            if m.offsets_by_partition().get((topics.samples, partition), 0) > offset:
                latencies.append((m.created_at - event_ms) / 1000.0)
                break
    arr = np.array(latencies)
    emit("trainer", "freshness_event_to_promoted_snapshot", float(np.median(arr)), "s", len(arr),
         p50=round(float(np.percentile(arr, 50)), 3), p99=round(float(np.percentile(arr, 99)), 3))
    OUT.mkdir(exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.hist(arr, bins=50)
    ax.set_xlabel("event time -> first promoted snapshot containing it (s)")
    ax.set_ylabel("samples")
    ax.set_title(f"Trainer freshness, {len(arr)} samples: p50 {np.median(arr):.2f}s, "
                 f"p99 {np.percentile(arr, 99):.2f}s")
    fig.tight_layout()
    fig.savefig(OUT / "trainer_freshness.png", dpi=100)
    print(f"wrote {OUT / 'trainer_freshness.png'}", file=sys.stderr)


def sharding(rank_counts: list[int], rows: int = 4096, steps: int = 20) -> None:
    """The trainer's replicated tables (ranks exchanging gradients) against row-wise sharded ones
    (benchmarks/sharded_tables.py), one step per micro-batch of `rows` per rank, gloo ranks on this
    machine: samples/s, bytes a rank sends per step and table bytes a rank holds."""
    import torch.multiprocessing as mp

    from benchmarks.sharded_tables import measure_rank

    for world in rank_counts:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "figures.json"
            print(f"sharding: {world} ranks, {steps} steps of {rows} samples per rank each way", file=sys.stderr,
                  flush=True)
            mp.spawn(measure_rank, args=(world, str(Path(tmp) / "store"), rows, steps, str(out)), nprocs=world)
            got = json.loads(out.read_text())
        for how in ("replicated", "sharded"):
            emit("trainer", f"{how}_tables_samples_per_s_mf_b{rows}_ranks{world}", got[f"{how}_samples_per_s"],
                 "samples/s", steps * rows * world, sent_bytes_per_step=round(got[f"{how}_sent_bytes_per_step"]),
                 table_bytes_per_rank=got[f"{how}_table_bytes_per_rank"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=15.0, help="freshness run length")
    parser.add_argument("--rate", type=float, default=10_000, help="samples/s produced in the freshness run")
    parser.add_argument("--step-seconds", type=float, default=2.0, help="time per throughput cell")
    parser.add_argument("--use-running-services", action="store_true",
                        help="use the configured Kafka/Redis instead of starting fresh ones")
    parser.add_argument("--only", choices=["ranks", "service", "sharding"], default=None,
                        help="ranks: only the 1-3 ranks runs, exchanging samples and exchanging gradients; "
                             "service: only the service's samples/s from a backlog; sharding: only the "
                             "replicated tables against sharded ones, 2 and 3 ranks")
    parser.add_argument("--repeats", type=int, default=3, help="service runs whose median is reported")
    parser.add_argument("--samples", type=int, default=SERVICE_SAMPLES,
                        help="the service runs' backlog (whole batches of 4,096 are best: see SERVICE_SAMPLES)")
    parser.add_argument("--samples-per-message", type=int, default=None,
                        help="samples per message of the service runs' topic, above 1 as TrainingSampleBlocks "
                             "(default: flink.samples_per_message, as the feature job writes them)")
    args = parser.parse_args()
    per_message = args.samples_per_message or load_settings().flink.samples_per_message
    if args.only == "service":
        with services(load_settings(), own=not args.use_running_services) as settings:
            service_throughput(settings, args.samples, args.repeats, per_message)
        return
    if args.only == "sharding":
        sharding([2, 3])
        return
    if args.only == "ranks":
        with services(load_settings(), own=not args.use_running_services) as settings:
            ranks_throughput(settings, 200_000, [1, 2, 3])
            ranks_throughput(settings, 200_000, [2, 3], exchange="gradients")
        return
    throughput(["mf", "deepfm"], [512, 4096, 16384], args.step_seconds)
    shadow_cost([(), ("plain", "ema"), ("plain", "ema", "ewc", "ema+ewc")], 4096, args.step_seconds)
    with services(load_settings(), own=not args.use_running_services) as settings:
        service_throughput(settings, args.samples, args.repeats, per_message)
        ranks_throughput(settings, 200_000, [1, 2, 3])
        ranks_throughput(settings, 200_000, [2, 3], exchange="gradients")
        freshness(settings, args.seconds, args.rate)
    sharding([2, 3])


if __name__ == "__main__":
    main()
