"""A TableEnvironment configured from Settings: jars, checkpointing, parallelism, time zone."""

from __future__ import annotations

import os

from pyflink.table import EnvironmentSettings, TableEnvironment

from core.settings import Settings
from flink_jobs.jars import job_jars


def table_environment(settings: Settings, streaming: bool = True) -> TableEnvironment:
    f = settings.flink
    # The mini-cluster's JVM reads these when the gateway starts (first TableEnvironment of the process).
    f.log_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("FLINK_LOG_DIR", str(f.log_dir))
    os.environ.setdefault("JVM_ARGS", f"-Xmx{f.jvm_heap}")
    env_settings = EnvironmentSettings.in_streaming_mode() if streaming else EnvironmentSettings.in_batch_mode()
    t_env = TableEnvironment.create(env_settings)
    conf = t_env.get_config()
    if f.prebuilt_jars_dir is not None:
        jars = [p.resolve().as_uri() for p in sorted(f.prebuilt_jars_dir.glob("*.jar"))]
    else:
        jars = job_jars(settings.services.cache_dir)
    conf.set("pipeline.jars", ";".join(jars))
    conf.set("parallelism.default", str(f.parallelism))
    conf.set("table.local-time-zone", "UTC")
    conf.set("table.exec.source.idle-timeout", f"{f.idle_timeout_ms} ms")
    conf.set("pipeline.auto-watermark-interval", f"{f.watermark_interval_ms} ms")
    conf.set("execution.buffer-timeout.interval", f"{f.buffer_timeout_ms} ms")
    conf.set("pipeline.name", "rtrec-features")
    conf.set("restart-strategy.type", "failure-rate")
    conf.set("restart-strategy.failure-rate.max-failures-per-interval", str(f.max_restarts))
    conf.set("restart-strategy.failure-rate.failure-rate-interval", f"{f.restart_window_s} s")
    conf.set("restart-strategy.failure-rate.delay", f"{f.restart_delay_ms} ms")
    conf.set("metrics.fetcher.update-interval", "2000")  # the REST figures `features run` reports
    if f.checkpoint_interval_ms > 0:
        conf.set("execution.checkpointing.interval", f"{f.checkpoint_interval_ms} ms")
        conf.set("execution.checkpointing.mode", "EXACTLY_ONCE")
        conf.set("execution.checkpointing.dir", f.checkpoint_dir.resolve().as_uri())
        conf.set("execution.checkpointing.externalized-checkpoint-retention", "RETAIN_ON_CANCELLATION")
        conf.set("execution.checkpointing.tolerable-failed-checkpoints", str(f.checkpoint_failures_tolerated))
    return t_env
