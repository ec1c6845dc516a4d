"""Feature-job figures on the local services:

- pipeline: events/s through the whole job into every sink (features, samples, dead letters) and, in
  the same run, the engine's own 3 s tumbling window over the same source and decoding into a
  blackhole; the ratio is the figure (both bounded over the same pre-produced events; job start-up,
  measured on an empty range, is subtracted), with the feature records written per event;
- loader: windowed rows/s from the features topic into Redis;
- end_to_end (only with `--only end_to_end`): events/s from the events topic through the job and one,
  then two, loader processes into Redis, the job's start-up subtracted, with the rows loaded beside the
  feature records committed;
- freshness: window close (window end + watermark delay) -> readable in Redis, p50/p99, live; the
  users' recent lists apart;
  the windows' part up to the loader (fetched and decoded), and the loader's write time per record,
  its own CPU and Redis's script time per record beside it;
- reads: entities/s through get_online_features (batches of 100 and 1000 users drawn at random)
  against redis-benchmark's pipelined HMGET rate for the same command shape, of random users and of
  one user; then reads of distinct counterparts over the tiled horizons (merged from the tiles'
  sketches) against reads of impressions over them;
- stages (only with `--only stages`): events/s through ever more of the job, to show where time goes;
- options (only with `--only options [--cases a,b] [--rounds N]`): the whole job under each of
  OPTION_CASES' Flink options (RocksDB, buffer timeout, object reuse, ...), interleaved.

Run: `.venv/bin/python -m benchmarks.bench_features [--events 300000]`. Writes
`benchmarks/out/feature_freshness_<case>.png`.
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from benchmarks.bench_trainer import services
from benchmarks.common import emit
from benchmarks.run_data import remove_runs, tracked
from core.kafka import consumer_config, ensure_topics, producer_config
from core.log_range import Earliest, Latest, LogRange
from core.settings import Settings, load_settings
from feature_store.keys import entity_key_prefix
from feature_store.loader import LoaderConfig, LoaderStats, run_loader
from feature_store.redis_store import RedisFeatureStore, tile_layout
from flink_jobs.environment import table_environment
from flink_jobs.feature_job import add_decoded_views, add_events_source, add_operators, build_job
from flink_jobs.feature_sql import tumble_table
from rtrec.reports import Freshness
from rtrec.sources.produce import produce_synthetic
from schemas.feature_set import names_for
from schemas.serde import serializer

OUT = Path(__file__).parent / "out"


def isolated(settings: Settings, **flink: object) -> Settings:
    run_id, checkpoints = f"bf{uuid.uuid4().hex[:8]}", Path(tempfile.mkdtemp())
    s = settings.namespaced(run_id)
    return tracked(s.model_copy(update={"flink": s.flink.model_copy(update={"checkpoint_dir": checkpoints, **flink})}),
                   run_id, checkpoints)


def on_session_cluster(s: Settings, jobmanager: str) -> Settings:
    """`s` submitting its jobs to the session cluster at `jobmanager` (HOST:PORT): the job graph is built
    here and sent with its jars, as `flink run` does; every operator runs in the cluster's JVMs.

    >>> on_session_cluster(Settings(), "127.0.0.1:18081").flink.config["rest.port"]
    '18081'
    """
    host, port = jobmanager.rsplit(":", 1)
    remote = {"execution.target": "remote", "rest.address": host, "rest.port": port}
    return s.model_copy(update={"flink": s.flink.model_copy(update={"config": {**s.flink.config, **remote}})})


def bounded_seconds(s: Settings, query: str, log_range: LogRange) -> float:
    """Seconds for one bounded run of `query` over `log_range`: "job" (the whole job, every sink),
    "operators" (the job with its feature and sample rows into blackholes instead of the topics),
    "window" (the reference: the job's source and decoding, then one 3 s tumbling count per user of the
    well-formed events, the engine's own window, into a blackhole) or "decode" (the source and decoding
    alone)."""
    t_env = table_environment(s)
    began = time.perf_counter()
    if query == "job":
        build_job(s, t_env, log_range=log_range, job_id=f"bench-{uuid.uuid4().hex[:6]}").execute().wait()
        return time.perf_counter() - began
    _decoded_events(t_env, s, log_range)
    statements = t_env.create_statement_set()
    if query == "decode":
        t_env.execute_sql("CREATE TEMPORARY TABLE hole (user_id STRING, item_id STRING, event_type STRING) "
                          "WITH ('connector' = 'blackhole')")
        statements.add_insert_sql("INSERT INTO hole SELECT user_id, item_id, event_type FROM events")
    elif query == "window":
        t_env.execute_sql("CREATE TEMPORARY TABLE hole (user_id STRING, window_end TIMESTAMP(3), n BIGINT) "
                          "WITH ('connector' = 'blackhole')")
        statements.add_insert_sql(f"INSERT INTO hole SELECT user_id, window_end, COUNT(*) FROM "
                                  f"TABLE({tumble_table(s.flink.window_s)}) GROUP BY window_start, window_end, user_id")
    elif query == "operators":
        add_operators(s, t_env, "events_raw", with_samples=True)
        for view in ("feature_rows", "sample_rows"):
            t_env.execute_sql(f"CREATE TEMPORARY TABLE {view}_hole (`key` BYTES, `value` BYTES, "
                              "`headers` MAP<STRING, BYTES>) WITH ('connector' = 'blackhole')")
            statements.add_insert_sql(f"INSERT INTO {view}_hole SELECT * FROM {view}")
    else:
        raise ValueError(f"no query {query!r}")
    statements.execute().wait()
    return time.perf_counter() - began


def _decoded_events(t_env: Any, s: Settings, log_range: LogRange) -> None:
    """The job's source (`events_raw`) and its decoding in SQL, as the views `events_decoded` and
    `events` (the well-formed)."""
    add_events_source(s, t_env, "events", s.flink.group_id + "b", log_range)
    add_decoded_views(s, t_env, "events")


def rate(s: Settings, query: str, n_events: int) -> float:
    """Events/s of one bounded run of `query` over the whole topic, its start-up (a run over an empty
    range) subtracted."""
    everything, nothing = LogRange(Earliest(), Latest()), LogRange(Latest(), Latest())
    return n_events / (bounded_seconds(s, query, everything) - bounded_seconds(s, query, nothing))


def produce_backlog(s: Settings, n_events: int) -> None:
    """`n_events` synthetic events whose event times all lie in the past (the broker refuses a record
    more than an hour ahead of its clock, and the job dead-letters it): they end ten minutes ago, or
    an hour ago for a short backlog."""
    span_ms = int(n_events / s.synthetic.events_per_second_event_time * 1000)
    produce_synthetic(s, n_events, start_ms=int(time.time() * 1000) - max(3_600_000, span_ms + 600_000),
                      progress=True)


def pipeline(settings: Settings, n_events: int, rounds: int = 2) -> None:
    """The whole job and the reference window query over the same events, alternating for `rounds`
    rounds after a run of each that only warms the JVM. Measured once each, the job ran first in a
    cold JVM and the reference after it in a warm one, so the two were not measured alike. The figures
    are the medians; each round's ratio is printed too, and what the job wrote per event."""
    s = isolated(settings)
    k = s.kafka
    ensure_topics(k.bootstrap_servers, list(k.topics.model_dump().values()), k.partitions)
    print(f"producing {n_events} synthetic events", file=sys.stderr)
    produce_backlog(s, n_events)
    everything = LogRange(Earliest(), Latest())
    bounded_seconds(_own_outputs(s), "job", everything)  # warm-ups
    bounded_seconds(s, "window", everything)
    full: list[float] = []
    hole: list[float] = []
    written: dict[str, int] = {}
    for r in range(rounds):
        case = _own_outputs(s)  # sinks of its own per run, as in options()
        full.append(rate(case, "job", n_events))
        hole.append(rate(s, "window", n_events))
        t = case.kafka.topics
        written = {kind: committed_records(case, topic) for kind, topic in
                   (("features", t.features), ("samples", t.samples), ("dead_letters", t.dead_letter))}
        print(f"round {r + 1}/{rounds}: all sinks {full[-1]:,.0f} events/s, 3 s window into a blackhole "
              f"{hole[-1]:,.0f} events/s, ratio {full[-1] / hole[-1]:.3f}; wrote {written}",
              file=sys.stderr, flush=True)
    ratios = [f / h for f, h in zip(full, hole, strict=True)]
    emit("features", "pipeline_all_sinks", float(np.median(full)), "events/s", n_events,
         runs=[round(x) for x in full], wrote=written)
    emit("features", "pipeline_window_blackhole", float(np.median(hole)), "events/s", n_events,
         runs=[round(x) for x in hole])
    emit("features", "pipeline_ratio_all_sinks_vs_window_blackhole", float(np.median(ratios)), "ratio", n_events,
         runs=[round(x, 3) for x in ratios])
    emit("features", "feature_records_per_event", written["features"] / n_events, "records/event", n_events)


def end_to_end(settings: Settings, n_events: int, loader_counts: tuple[int, ...] = (1, 2)) -> None:
    """The issue's end-to-end figure: events topic -> job -> topics -> loaders -> Redis. Loader processes
    (the settings' isolation) join their group on the job's own features topic, then the bounded job
    runs over the backlog; the time is from the job's submission to the last batch a loader wrote into
    Redis, less the job's start-up (a run over an empty range), as in `pipeline`. Every committed
    feature record must have reached Redis: the loaders' row count is printed beside the topic's."""
    s = isolated(settings)
    k = s.kafka
    ensure_topics(k.bootstrap_servers, list(k.topics.model_dump().values()), k.partitions)
    print(f"producing {n_events} synthetic events", file=sys.stderr)
    produce_backlog(s, n_events)
    everything, nothing = LogRange(Earliest(), Latest()), LogRange(Latest(), Latest())
    bounded_seconds(_own_outputs(s), "job", everything)  # warms the JVM
    start_up = bounded_seconds(s, "job", nothing)
    store = RedisFeatureStore.from_settings(s.redis, s.flink)
    for n_loaders in loader_counts:
        case = _own_outputs(s)
        group = f"{case.flink.loader_group_id}-{uuid.uuid4().hex[:6]}"
        workers, queue = _start_loaders(case, group, n_loaders, E2E_IDLE_EXIT_S, None)
        redis_cpu_before = _redis_cpu_s(store)
        submitted = time.perf_counter()
        bounded_seconds(case, "job", everything)
        job_s = time.perf_counter() - submitted
        results = _loader_results(workers, queue, timeout_s=900)
        redis_cpu_after = _redis_cpu_s(store)
        redis_cpu_s = (None if redis_cpu_before is None or redis_cpu_after is None
                       else redis_cpu_after - redis_cpu_before)
        loaded = sum(r[0] for r in results)
        last_write = max(r[2] for r in results if r[0])
        took = last_write - submitted - start_up
        committed = committed_records(case, case.kafka.topics.features)
        print(f"{n_loaders} loader(s): job {job_s - start_up:.1f} s, last row in Redis {took:.1f} s after it "
              f"started; {loaded:,} rows loaded of {committed:,} committed feature records", file=sys.stderr)
        emit("features", f"end_to_end_events_into_redis_{n_loaders}_loader", n_events / took, "events/s", n_events,
             job_events_per_s=round(n_events / (job_s - start_up)), rows_loaded=loaded,
             feature_records_committed=committed, partitions=k.partitions,
             redis_cpu_s=None if redis_cpu_s is None else round(redis_cpu_s, 1),
             redis_cpu_us_per_row=None if redis_cpu_s is None else round(redis_cpu_s / max(loaded, 1) * 1e6, 2))


def _redis_cpu_s(store: RedisFeatureStore) -> float | None:
    """The CPU time Redis's process has used, all its threads (the end-to-end bound here), None where
    INFO is refused."""
    cpu = _redis_info(store, "cpu")
    return None if cpu is None else float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


E2E_IDLE_EXIT_S = 30.0  # longer than a loader waits for the job's start and its first checkpoint


def stages(settings: Settings, n_events: int) -> None:
    """Where the pipeline's time goes: the same events through ever more of the job (see
    bounded_seconds), the last line every real sink."""
    s = isolated(settings)
    k = s.kafka
    ensure_topics(k.bootstrap_servers, list(k.topics.model_dump().values()), k.partitions)
    produce_backlog(s, n_events)
    bounded_seconds(s, "operators", LogRange(Earliest(), Latest()))  # warms the JVM
    for name in ("decode", "window", "operators", "job"):
        emit("features", f"stage_{name}", rate(_own_outputs(s) if name == "job" else s, name, n_events),
             "events/s", n_events)


# Flink options worth measuring on the whole job (issue: "measure each, keep what pays"): each case's
# update of the flink settings, against the defaults in the same process and rounds. A rate counts only
# if the case wrote what the defaults wrote.
OPTION_CASES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "rocksdb": {"config": {"state.backend.type": "rocksdb"}},
    "buffer_timeout_100ms": {"buffer_timeout_ms": 100},
    "checkpoint_30s": {"checkpoint_interval_ms": 30_000},
    "fetch_1MiB": {"source_fetch_bytes": 1 << 20},
    "no_object_reuse": {"config": {"pipeline.object-reuse": "false"}},  # the job's default is on
    "parallelism_2": {"parallelism": 2},  # the events topic has 2 partitions
    # the sinks' producers: Kafka's own settings (16 KiB batches), smaller batches than the job's 1 MiB,
    # and its batches uncompressed
    "kafka_producer_defaults": {"sink_producer": {}},
    "sink_batches_256KiB": {"sink_producer": {"linger.ms": "20", "batch.size": "262144", "compression.type": "lz4"}},
    "sink_uncompressed": {"sink_producer": {"linger.ms": "20", "batch.size": "1048576"}},
    # a bound: what the users' recent lists cost
    "no_history": {"history_length": 0},
    # what the tiles' sketches of counterpart hashes cost the job (the default keeps 64 per tile)
    "no_distinct_sketches": {"distinct_sketch_size": 0},
    "distinct_sketches_128": {"distinct_sketch_size": 128},
}


def options(settings: Settings, n_events: int, rounds: int, names: list[str]) -> None:
    """The whole job (every sink) over the same events once per case and round, cases interleaved
    within each round so that drift of the machine and the JVM's warm-up spread over all of them; a
    first unmeasured run warms the JVM. Start-up is subtracted per case as in pipeline()."""
    s = isolated(settings)
    k = s.kafka
    ensure_topics(k.bootstrap_servers, list(k.topics.model_dump().values()), k.partitions)
    produce_backlog(s, n_events)
    bounded_seconds(s, "job", LogRange(Earliest(), Latest()))
    rates: dict[str, list[float]] = {n: [] for n in names}
    written: dict[str, dict[str, int]] = {}
    for r in range(rounds):
        for name in names:
            case = _own_outputs(with_option(s, OPTION_CASES[name]))
            rates[name].append(rate(case, "job", n_events))
            t = case.kafka.topics
            written[name] = {kind: committed_records(case, topic) for kind, topic in
                             (("features", t.features), ("samples", t.samples), ("dead_letters", t.dead_letter))}
            print(f"round {r + 1}/{rounds} {name}: {rates[name][-1]:,.0f} events/s, wrote {written[name]}",
                  file=sys.stderr, flush=True)
    for name, runs in rates.items():
        same = written[name] == written["defaults"] if "defaults" in written else None  # None: no defaults run
        emit("features", f"options_{name}", float(np.median(runs)), "events/s", n_events,
             runs=[round(x) for x in runs], options=OPTION_CASES[name], wrote=written[name],
             same_output_as_defaults=same)


def with_option(s: Settings, option: dict[str, Any]) -> Settings:
    """`s` with an OPTION_CASES entry applied, its Flink config keys added to those `s` has.

    >>> with_option(on_session_cluster(Settings(), "h:1"), OPTION_CASES["no_object_reuse"]).flink.config["rest.address"]
    'h'
    """
    update = {**option, "config": {**s.flink.config, **option.get("config", {})}}
    return s.model_copy(update={"flink": s.flink.model_copy(update=update)})


def _own_outputs(s: Settings) -> Settings:
    """`s` writing to sink topics of its own (the events topic stays), so that each run's output is counted."""
    suffix = uuid.uuid4().hex[:6]
    t = s.kafka.topics
    topics = t.model_copy(update={k: f"{getattr(t, k)}.{suffix}" for k in ("features", "samples", "dead_letter")})
    ensure_topics(s.kafka.bootstrap_servers, [topics.features, topics.samples, topics.dead_letter], s.kafka.partitions)
    return s.model_copy(update={"kafka": s.kafka.model_copy(update={"topics": topics})})


def committed_records(s: Settings, topic: str) -> int:
    """How many committed records `topic` holds (read to the end of every partition)."""
    consumer = Consumer(consumer_config(s.kafka.bootstrap_servers, f"count-{uuid.uuid4().hex[:8]}",
                                        **{"enable.partition.eof": True}))
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    count, at_end = 0, set()
    try:
        while len(at_end) < len(partitions):
            for msg in consumer.consume(10_000, timeout=5.0):
                if msg.error() is None:
                    count += 1
                elif msg.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition())
                else:
                    raise RuntimeError(f"reading {topic}: {msg.error()}")
    finally:
        consumer.close()
    return count


TILES_MS = {h: tile * 1000 for h, tile in tile_layout(Settings().flink).items()}  # the default job's


def feature_record(k: int, t: int) -> dict:
    return {"entity_type": "user", "entity_id": f"u{k}", "horizon_s": 3, "window_start": t - 3000, "window_end": t,
            "impressions": k % 7, "clicks": k % 3, "likes": 0, "carts": 0, "orders": 0, "ctr": 0.1,
            "dwell_sum_ms": 100, "dwell_mean_ms": 50.0, "distinct_counterparts": 2, "dwell_count": 2}


# the counterparts a user's or item's tile holds in the demo's stream (2,000 events/s, 500 users, 2,000
# items): about 12 items per user in 3 s, 100 in 30 s (its sketch keeps 64), 3 and 30 users per item
TILE_COUNTERPARTS = {("user", 60): 12, ("user", 600): 100, ("item", 60): 3, ("item", 600): 30}
SKETCH_SIZE = Settings().flink.distinct_sketch_size  # the default job's


def _scripts_usec(store: RedisFeatureStore) -> int | None:
    """Redis's own count of microseconds spent running scripts (every client's), None where INFO is refused."""
    stats = _redis_info(store, "commandstats")
    return None if stats is None else int(stats.get("cmdstat_evalsha", {}).get("usec", 0))


def _redis_info(store: RedisFeatureStore, section: str) -> dict[str, Any] | None:
    """A section of Redis's INFO, None where an ACL refuses it (the benchmark runs without the figure)."""
    try:
        return store.client.info(section)
    except redis.ResponseError:
        return None


def loader_record(k: int, t: int) -> dict:
    """A mix like the job's output: users, items and pairs over the three horizons (the longer ones as
    the default job's tiles, a user's or item's with its sketch of counterpart hashes; its 60 s tile is
    its 3 s window's record, which lists the horizon), and one row in eight a user's recent-engagements
    list (horizon 0) of five items."""
    if k % 8 == 7:
        return {**feature_record(k, t), "horizon_s": 0, "recent_items": [f"i{k - j}" for j in range(5)],
                "recent_types": ["click"] * 5, "recent_times_ms": [t - 1000 * j for j in range(5)]}
    entity_type = ("user", "item", "user_item")[k % 3]
    horizon = (3, 3, 60, 600)[k % 4]
    counterparts = TILE_COUNTERPARTS.get((entity_type, horizon), 0)
    sketch = {}
    if counterparts:
        hashes = np.random.default_rng(k).integers(0, 1 << 63, counterparts, dtype=np.int64)
        sketch = {"distinct_counterparts": counterparts,
                  "counterpart_hashes": np.sort(hashes)[:SKETCH_SIZE].tolist()}
    if TILES_MS.get(horizon) == 3000 and entity_type != "user_item":
        sketch["tile_of_horizons_s"] = [horizon]
        horizon = 3
    return {**feature_record(k, t), "entity_type": entity_type, "entity_id": f"{entity_type[0]}{k % 50_000}",
            "horizon_s": horizon, "window_start": t - TILES_MS.get(horizon, horizon * 1000), **sketch}


def loader_rate(settings: Settings, n_rows: int) -> None:
    """Loaders join their group first (one per partition at most), then the rows are produced, encoded
    beforehand so that the producer in this process is not what the figure measures."""
    now = int(time.time() * 1000)
    encode = serializer("FeatureRecord")
    rows = [(f"r{i}".encode(), encode(loader_record(i, now))) for i in range(n_rows)]
    for n_loaders in (1, 2):
        s = isolated(settings)
        k = s.kafka
        ensure_topics(k.bootstrap_servers, [k.topics.features, k.topics.dead_letter], k.partitions)
        workers, queue = _start_loaders(s, s.flink.loader_group_id, n_loaders)
        producer = Producer(producer_config(k.bootstrap_servers))
        for key, value in rows:
            while True:
                try:
                    producer.produce(k.topics.features, value=value, key=key, headers=encode.headers)
                    break
                except BufferError:
                    producer.poll(0.05)
        if producer.flush(60):
            raise RuntimeError("feature records still undelivered after 60 s")
        results = _loader_results(workers, queue, timeout_s=600)
        busy = [r for r in results if r[0]]
        records = sum(r[0] for r in busy)
        # from the first batch any process received to the last one written (start-up excluded)
        took = max(r[2] for r in busy) - min(r[1] for r in busy)
        emit("features", f"loader_rows_into_redis_{n_loaders}_process", records / took, "rows/s", records,
             partitions=k.partitions, processes_with_rows=len(busy))


def _start_loaders(s: Settings, group: str, n: int, *loader_args: Any) -> tuple[list[Any], Any]:
    """`n` loader processes (`_loader_process`, with `loader_args` after its queue) in `group`, started
    and given the time to import and join the group; their results come through the queue."""
    context = multiprocessing.get_context("spawn")  # librdkafka threads do not survive a fork
    queue = context.Queue()
    workers = [context.Process(target=_loader_process, args=(s, group, queue, *loader_args)) for _ in range(n)]
    for w in workers:
        w.start()
    time.sleep(12)  # imports and the group join
    return workers, queue


def _loader_results(workers: list[Any], queue: Any, timeout_s: float) -> list[tuple[int, float, float]]:
    """Each loader's rows written, its first batch's start and its last batch's end (perf_counter)."""
    results = [queue.get(timeout=timeout_s) for _ in workers]
    for w in workers:
        w.join()
    return results


def _loader_process(s: Settings, group: str, queue: Any, idle_exit_s: float = 20.0,
                    isolation: str | None = "read_committed") -> None:
    """A loader in a process of its own; `isolation` None: the settings' (the users' default)."""
    overrides: dict[str, Any] = {} if isolation is None else {"isolation_level": isolation}
    config = LoaderConfig.from_settings(s, group_id=group, batch=20_000, poll_timeout_s=LOADER_POLL_S, **overrides)
    stats = run_loader(config, RedisFeatureStore(s.redis.url, s.redis.key_prefix, 3600), idle_exit_s=idle_exit_s,
                       on_batch=lambda st: _mark(st))
    queue.put((stats.records, _BATCH_AT[0], _BATCH_AT[1]))


LOADER_POLL_S = 0.05
_BATCH_AT = [0.0, 0.0]  # first batch started (approximately: end of the first poll), last batch done


def _mark(stats: LoaderStats) -> None:
    now = time.perf_counter()
    if stats.batches == 1:
        _BATCH_AT[0] = now - LOADER_POLL_S  # the first poll's wait, at most its timeout
    _BATCH_AT[1] = now


def freshness(settings: Settings, seconds: float, rate: float, checkpoint_ms: int, isolation: str,
              measured: bool = True, with_samples: bool = False) -> None:
    """Window close -> readable in Redis for `seconds` of live events at `rate`; `measured=False`: a run
    that only warms the JVM (the first run of a process was the slowest: p99 1.14 s, then 0.66 s and
    0.99 s at 2,000 events/s). `with_samples`: the job writes the training samples too, as in the demo
    and `features run` (nothing reads them here)."""
    s = isolated(settings, checkpoint_interval_ms=checkpoint_ms)
    s = s.model_copy(update={"synthetic": s.synthetic.model_copy(update={"events_per_second_event_time": rate})})
    k = s.kafka
    ensure_topics(k.bootstrap_servers, list(k.topics.model_dump().values()), k.partitions)
    job = build_job(s, table_environment(s), with_samples=with_samples,
                    job_id=f"fresh-{uuid.uuid4().hex[:6]}").execute()
    stop = threading.Event()
    results = []
    store = RedisFeatureStore(s.redis.url, s.redis.key_prefix, 3600)
    scripts_before = _scripts_usec(store)
    loader = threading.Thread(target=lambda: results.append(run_loader(
        LoaderConfig.from_settings(s, isolation_level=isolation), store, should_stop=stop.is_set)))
    loader.start()
    time.sleep(5)
    # event time = wall clock; in a process of its own: beside the loader, the two shared one
    # interpreter, and at 20,000 events/s the producer fell behind and held the loader back
    producer = multiprocessing.get_context("spawn").Process(  # librdkafka threads do not survive a fork
        target=produce_synthetic, args=(s, int(rate * seconds)), kwargs={"progress": False, "live": True})
    producer.start()
    producer.join()
    if producer.exitcode != 0:
        raise RuntimeError(f"the events' producer exited with {producer.exitcode}")
    time.sleep(8)
    stop.set()
    loader.join()
    scripts_after = _scripts_usec(store)
    job.get_job_client().cancel().result()
    remove_runs()  # each run starts on the services as the one before found them
    if not measured:
        return
    # only windows that closed while events flowed (the last ones close on the next events, never here);
    # the recent lists apart
    stats = results[0]
    fresh = Freshness.of(stats.latencies_ms, stats.horizons_s, s.flink.watermark_delay_ms, stats.received_ms)
    received = fresh.windows_at_loader_ms  # the job's and Kafka's part of the latency
    per_record = 1e6 / max(stats.records, 1)
    # where the loader's time per record goes: its own CPU, and the rest (Redis, waiting for a core)
    split = {"at_loader_p50": round(float(np.percentile(received, 50)), 1) if len(received) else None,
             "at_loader_p99": round(float(np.percentile(received, 99)), 1) if len(received) else None,
             "loader_write_us_per_record": round(stats.write_s * per_record, 1),
             "loader_write_cpu_us_per_record": round(stats.write_cpu_s * per_record, 1),
             "redis_scripts_us_per_record": (None if scripts_before is None or scripts_after is None
                                             else round((scripts_after - scripts_before) / max(stats.records, 1), 1))}
    case = f"checkpoint_{checkpoint_ms}ms_{isolation}" + ("_with_samples" if with_samples else "")
    for what, close in (("", fresh.windows_ms), ("recent_lists_", fresh.recent_lists_ms)):
        if len(close):
            # in the order the loader got them: the first fifth is the JVM compiling the job's code
            fifths = [round(float(np.percentile(part, 99)), 1) for part in np.array_split(close, 5) if len(part)]
            emit("features", f"{what}window_close_to_redis_{case}", float(np.median(close)), "ms", len(close),
                 p50=round(float(np.percentile(close, 50)), 1), p99=round(float(np.percentile(close, 99)), 1),
                 p99_by_fifth=fifths, **(split if not what else {}))
    OUT.mkdir(exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, ms, alpha in (("windows", fresh.windows_ms, 1.0), ("windows at the loader", received, 0.6),
                            ("recent lists", fresh.recent_lists_ms, 0.7)):
        if len(ms):
            ax.hist(ms / 1000.0, bins=50, alpha=alpha,
                    label=f"{name}: p50 {np.median(ms) / 1000:.2f}s, p99 {np.percentile(ms, 99) / 1000:.2f}s")
    ax.legend()
    ax.set_xlabel("window close -> readable in Redis, or at the loader (s)")
    ax.set_ylabel("feature records")
    ax.set_title(f"checkpoint {checkpoint_ms} ms, loader {isolation}" + (", with samples" if with_samples else ""))
    fig.tight_layout()
    fig.savefig(OUT / f"feature_freshness_{case}.png", dpi=100)


def reads(settings: Settings, n_entities: int = 20_000) -> None:
    """One caller, then four concurrent callers (threads sharing the store), each reading batches of
    users drawn at random, against redis-benchmark with its default 50 connections and with one,
    pipelining as deep as the batch: the same HMGET of random users among the same ones (`-r`, ratio_*),
    and of one user over and over (same_key_*, as hot in Redis's caches as a read can be). Then four
    callers as processes with a store each (`..._callers4_processes`): threads share one GIL, which
    four busy readers saturate, so processes are how a server gets more reads out of more cores."""
    s = isolated(settings)
    store = RedisFeatureStore.from_settings(s.redis, s.flink)
    now = int(time.time() * 1000)
    # ids as redis-benchmark -r writes its random numbers (12 digits), so that it reads these users
    ids = [f"u{i:012d}" for i in range(n_entities)]
    # one tile per horizon: a ring's fields are all written with its first tile and read whole, however many of
    # its tiles were written
    records = [{**feature_record(i, now), "entity_id": ids[i], "horizon_s": h, "window_start": now - TILES_MS[h]}
               for i in range(n_entities) for h in (60, 600)]
    for start in range(0, len(records), 20_000):
        store.write_batch(records[start:start + 20_000])
    names = names_for("user")
    shuffled = [ids[i] for i in np.random.default_rng(5).permutation(n_entities)]
    port = s.redis.url.rsplit(":", 1)[1].split("/")[0]
    prefix, fields = entity_key_prefix(s.redis.key_prefix, "user"), store.fields_read(names)
    for batch in (100, 1000):
        reference: dict[str, float | None] = {}
        for clients in (50, 1):
            reference[f"c{clients}"] = _redis_benchmark(port, f"{prefix}u__rand_int__", fields, batch, clients,
                                                        n_entities)
            reference[f"same_key_c{clients}"] = _redis_benchmark(port, prefix + ids[1], fields, batch, clients)
        for callers, processes in ((1, False), (4, False), (4, True)):
            rate, done = (_read_rate_in_processes(s, shuffled, names, batch, callers) if processes else
                          _read_rate(store, shuffled, names, batch, callers))
            extra = {f"redis_benchmark_{c}": ref for c, ref in reference.items() if ref is not None}
            extra.update({f"ratio_{c}": round(rate / ref, 3) for c, ref in reference.items() if ref})
            emit("features", f"reads_entities_per_s_batch{batch}_callers{callers}{'_processes' * processes}", rate,
                 "entities/s", done, **extra)


def distinct_reads(settings: Settings, n_entities: int = 2_000, batch: int = 100) -> None:
    """Reads of the users' distinct counterparts over 60 s and 600 s, merged from full rings of tiles
    with sketches as the demo's stream fills them (TILE_COUNTERPARTS), against the same reads of
    impressions, which need no sketch."""
    s = isolated(settings)
    store = RedisFeatureStore.from_settings(s.redis, s.flink)
    now = int(time.time() * 1000) // 30_000 * 30_000
    k = s.flink.distinct_sketch_size
    rng = np.random.default_rng(3)
    for user in range(n_entities):
        tiles = []
        for h, tile_ms in TILES_MS.items():
            n = TILE_COUNTERPARTS[("user", h)]
            for j in range(h * 1000 // tile_ms):
                hashes = np.sort(rng.integers(0, 1 << 63, n, dtype=np.int64))[:k].tolist()
                tiles.append({**feature_record(user, now - j * tile_ms), "horizon_s": h, "distinct_counterparts": n,
                              "window_start": now - (j + 1) * tile_ms, "counterpart_hashes": hashes})
        store.write_batch(tiles)
    ids = [f"u{i}" for i in range(n_entities)]
    for what in ("distinct_counterparts", "impressions"):
        rate, done = _read_rate(store, ids, [f"60s.{what}", f"600s.{what}"], batch, 1)
        emit("features", f"reads_{what}_60s_600s_entities_per_s_batch{batch}", rate, "entities/s", done,
             sketch_size=k)


def _read_rate(store: RedisFeatureStore, ids: list[str], names: list[str], batch: int, callers: int,
               seconds: float = 3.0) -> tuple[float, int]:
    counts = [0] * callers
    began = time.perf_counter()

    def caller(k: int) -> None:
        counts[k] = _read_share(store, ids, names, batch, k, callers, began + seconds)

    threads = [threading.Thread(target=caller, args=(k,)) for k in range(callers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(counts) / (time.perf_counter() - began), sum(counts)


def _read_rate_in_processes(settings: Settings, ids: list[str], names: list[str], batch: int, callers: int,
                            seconds: float = 3.0) -> tuple[float, int]:
    """As `_read_rate`, each caller a process with a store of its own; they start reading together,
    after their imports, and their rates add up."""
    context = multiprocessing.get_context("spawn")  # librdkafka threads do not survive a fork
    done, start = context.Queue(), context.Barrier(callers)
    workers = [context.Process(target=_caller_process,
                               args=(settings, ids, names, batch, k, callers, seconds, start, done))
               for k in range(callers)]
    for worker in workers:
        worker.start()
    results = [done.get(timeout=seconds + 300) for _ in workers]
    for worker in workers:
        worker.join(timeout=30)
    if any(worker.exitcode != 0 for worker in workers):
        raise RuntimeError(f"a reading process failed: exit codes {[w.exitcode for w in workers]}")
    return sum(rate for rate, _ in results), sum(n for _, n in results)


def _caller_process(settings: Settings, ids: list[str], names: list[str], batch: int, k: int, callers: int,
                    seconds: float, start: Any, done: Any) -> None:
    store = RedisFeatureStore.from_settings(settings.redis, settings.flink)
    store.get_online_features("user", ids[:batch], names)  # connected, and the read plan built
    start.wait(timeout=300)
    began = time.perf_counter()
    count = _read_share(store, ids, names, batch, k, callers, began + seconds)
    done.put((count / (time.perf_counter() - began), count))


def _read_share(store: RedisFeatureStore, ids: list[str], names: list[str], batch: int, k: int, callers: int,
                until: float) -> int:
    """Caller k of `callers` reads its share of `ids` in batches, over and over until `until`
    (perf_counter); returns the entities it read."""
    count = 0
    while time.perf_counter() < until:
        for first in range(k * batch, len(ids), batch * callers):
            store.get_online_features("user", ids[first:first + batch], names)
            count += len(ids[first:first + batch])
    return count


def _redis_benchmark(port: str, key: str, fields: list[str], pipeline: int, clients: int,
                     keyspace: int = 0) -> float | None:
    """HMGETs/s of `key` (with `keyspace`, __rand_int__ in it drawn from 0 to keyspace - 1 per command)."""
    bench = shutil.which("redis-benchmark")
    if bench is None:
        print("redis-benchmark not installed (Debian: redis-tools); no reference", file=sys.stderr)
        return None
    spread = ["-r", str(keyspace)] if keyspace else []
    out = subprocess.run([bench, "-p", port, "-n", "300000", "-c", str(clients), "-P", str(pipeline), "-q", *spread,
                          "hmget", key, *fields], capture_output=True, text=True).stdout
    match = re.search(r"([\d.]+) requests per second", out.replace(",", ""))
    return float(match.group(1)) if match else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--loader-rows", type=int, default=200_000)
    parser.add_argument("--fresh-seconds", type=float, default=20.0)
    parser.add_argument("--fresh-rate", type=float, default=2000.0)
    parser.add_argument("--fresh-cases", default="uncommitted-5000,committed-5000,committed-500",
                        help="--only freshness: the loader's isolation and the checkpoint interval (ms) per "
                             "case; a third part `samples` runs the job with the training samples too")
    parser.add_argument("--use-running-services", action="store_true")
    parser.add_argument("--only", default="pipeline,loader,freshness,reads")
    parser.add_argument("--loaders", default="1,2", help="--only end_to_end: loader processes per run")
    parser.add_argument("--rounds", type=int, default=2, help="--only options and pipeline: runs per case")
    parser.add_argument("--cases", default=",".join(OPTION_CASES), help="--only options: which cases")
    parser.add_argument("--jobmanager", default=None, metavar="HOST:PORT",
                        help="run the jobs on this session cluster (e.g. `rtrec features cluster up`'s "
                             "127.0.0.1:18081) instead of the embedded mini-cluster")
    args = parser.parse_args()
    only = set(args.only.split(","))
    with services(load_settings(), own=not args.use_running_services) as settings:
        if args.jobmanager:
            settings = on_session_cluster(settings, args.jobmanager)
        if "reads" in only:
            reads(settings)
            distinct_reads(settings)
        if "loader" in only:
            loader_rate(settings, args.loader_rows)
        if "freshness" in only:
            # the default (uncommitted reads) against waiting for each checkpoint's commit, after a
            # run that warms the JVM
            freshness(settings, min(args.fresh_seconds, 10.0), args.fresh_rate, 5000, "read_uncommitted",
                      measured=False)
            for case in args.fresh_cases.split(","):
                isolation, checkpoint_ms, *rest = case.split("-")
                freshness(settings, args.fresh_seconds, args.fresh_rate, int(checkpoint_ms), f"read_{isolation}",
                          with_samples=rest == ["samples"])
        if "pipeline" in only:
            pipeline(settings, args.events, args.rounds)
        if "end_to_end" in only:  # not in the default list: minutes per run at the scale
            end_to_end(settings, args.events, tuple(int(n) for n in args.loaders.split(",")))
        if "stages" in only:  # not in the default list: it is a profile, not a target
            stages(settings, args.events)
        if "options" in only:  # likewise: which Flink options pay on this machine
            options(settings, args.events, args.rounds, args.cases.split(","))


if __name__ == "__main__":
    main()
