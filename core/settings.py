"""The one configuration object: env vars (prefix `RTREC_`, nested with `__`) over a TOML file.

Only the CLI and `__main__` modules call `load_settings`; everything below receives `Settings`
or one of its sections.

>>> s = Settings()
>>> s.kafka.topics.events
'rtrec.interactions'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "rtrec"


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalSecuritySettings(Section):
    """`rtrec services up --secure`: Kafka with a SASL_SSL listener only (SCRAM users, the
    StandardAuthorizer, ACLs for `user` on the pipeline's topics, groups and transactional ids,
    named by the prefixes below) and Redis on TLS only with an ACL user confined to its keys."""

    enabled: bool = False
    user: str = "rtrec"
    topic_prefix: str = "rtrec."
    id_prefix: str = "rtrec-"  # consumer groups and transactional ids
    redis_key_prefix: str = "rtrec:"


class ServicesSettings(Section):
    """Local Kafka and Redis processes started by `rtrec services up`."""

    host: str = "127.0.0.1"
    kafka_port: int = 19092
    kafka_controller_port: int = 19093
    kafka_heap: str = "512m"
    redis_port: int = 16379
    state_dir: Path = Field(default_factory=lambda: _default_cache_dir() / "state")
    cache_dir: Path = Field(default_factory=_default_cache_dir)
    start_timeout_s: float = 90.0
    stop_timeout_s: float = 20.0
    # Where every Prometheus endpoint (trainer, loader, job) listens; 0.0.0.0 inside a container.
    metrics_host: str = "127.0.0.1"
    secure: LocalSecuritySettings = LocalSecuritySettings()

    @property
    def jar_cache_dir(self) -> Path:
        """Where Maven-resolved jars and the built UDF jar are cached."""
        return self.cache_dir / "jars"


class TopicSettings(Section):
    events: str = "rtrec.interactions"
    features: str = "rtrec.features"
    samples: str = "rtrec.samples"
    snapshots: str = "rtrec.snapshots"
    dead_letter: str = "rtrec.dead-letter"

    def suffixed(self, suffix: str) -> TopicSettings:
        """Every topic with `.suffix` appended: an isolated copy for a test or a benchmark.

        >>> TopicSettings().suffixed("t1").events
        'rtrec.interactions.t1'
        """
        return self.model_copy(update={k: f"{v}.{suffix}" for k, v in self.model_dump().items()})


class ClientCredentials(Section):
    """Who a network client is and how it checks the server: a user and its password (`password`, a
    secret that printed settings show as `**********`, or `password_file`, read when connecting) and
    PEM files for TLS (the CA that signed the server's certificate; a client certificate and key when
    the server asks for one)."""

    username: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = None
    ssl_ca_file: Path | None = None
    ssl_cert_file: Path | None = None
    ssl_key_file: Path | None = None

    def secret(self) -> str | None:
        """The password, from `password` or else `password_file`; None when neither is set."""
        if self.password is not None:
            return self.password.get_secret_value()
        if self.password_file is not None:
            return self.password_file.read_text().strip()
        return None


class KafkaSecuritySettings(ClientCredentials):
    """How every Kafka client authenticates and encrypts: the Python clients (librdkafka) and the
    feature job's Flink connector (Java), from one description. The password comes from `password` (a
    secret: printed settings show `**********`) or `password_file`, read when a client is configured.
    OAUTHBEARER is OIDC's client-credentials grant: `username` is the client id, the password its
    secret, `oauth_token_endpoint_url` where tokens come from (and `oauth_scope`, if the provider wants
    one); both clients fetch and refresh tokens themselves.
    `client_properties` / `flink_properties`: anything else, in each client's own names."""

    protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] = "SCRAM-SHA-512"
    oauth_token_endpoint_url: str | None = None
    oauth_scope: str | None = None
    client_properties: dict[str, str] = Field(default_factory=dict)
    flink_properties: dict[str, str] = Field(default_factory=dict)

    @property
    def oauth(self) -> bool:
        return self.sasl and self.sasl_mechanism == "OAUTHBEARER"

    def oauth_endpoint(self) -> str:
        if not self.oauth_token_endpoint_url:
            raise ValueError("kafka.security.sasl_mechanism OAUTHBEARER needs kafka.security.oauth_token_endpoint_url")
        return self.oauth_token_endpoint_url

    def jvm_system_properties(self) -> dict[str, str]:
        """What the JVM running the connector must allow: Kafka 4 clients fetch tokens only from URLs in
        a system property, and the connector reads it under its shaded name.

        >>> KafkaSecuritySettings(protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
        ...                       oauth_token_endpoint_url="https://idp/token").jvm_system_properties()
        {'org.apache.flink.kafka.shaded.org.apache.kafka.sasl.oauthbearer.allowed.urls': 'https://idp/token'}
        """
        if not self.oauth:
            return {}
        return {SHADED_KAFKA + "sasl.oauthbearer.allowed.urls": self.oauth_endpoint()}

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    def _login(self) -> tuple[str, str]:
        """(user, password) for SASL, or a ValueError naming the missing setting."""
        secret = self.secret()
        if not self.username or secret is None:
            missing = "username" if not self.username else "password or password_file"
            raise ValueError(f"kafka.security.protocol {self.protocol} needs kafka.security.{missing}")
        return self.username, secret

    def librdkafka(self) -> dict[str, str]:
        """Properties for confluent-kafka's producers, consumers and admin clients.

        >>> KafkaSecuritySettings().librdkafka()
        {}
        >>> sorted(KafkaSecuritySettings(protocol="SASL_SSL", username="u", password="p", ssl_ca_file="ca.pem")
        ...        .librdkafka().items())  # doctest: +NORMALIZE_WHITESPACE
        [('sasl.mechanism', 'SCRAM-SHA-512'), ('sasl.password', 'p'), ('sasl.username', 'u'),
         ('security.protocol', 'SASL_SSL'), ('ssl.ca.location', 'ca.pem')]
        """
        if self.protocol == "PLAINTEXT":
            return dict(self.client_properties)
        props = {"security.protocol": self.protocol}
        if self.oauth:
            client_id, secret = self._login()
            props |= {"sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
                      "sasl.oauthbearer.client.id": client_id, "sasl.oauthbearer.client.secret": secret,
                      "sasl.oauthbearer.token.endpoint.url": self.oauth_endpoint()}
            if self.oauth_scope:
                props["sasl.oauthbearer.scope"] = self.oauth_scope
        elif self.sasl:
            user, password = self._login()
            props |= {"sasl.mechanism": self.sasl_mechanism, "sasl.username": user, "sasl.password": password}
        if self.tls:
            files = {"ssl.ca.location": self.ssl_ca_file, "ssl.certificate.location": self.ssl_cert_file,
                     "ssl.key.location": self.ssl_key_file}
            props |= {k: str(v) for k, v in files.items() if v is not None}
        return props | self.client_properties

    def flink_connector(self) -> dict[str, str]:
        """The same for the Kafka client inside Flink's SQL connector (`properties.` is added there): a
        JAAS line for SASL, naming the login module by its shaded name (flink-sql-connector-kafka
        relocates Kafka's classes), and a PEM truststore for TLS.

        >>> j = KafkaSecuritySettings(protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", username="u",
        ...                           password="p").flink_connector()
        >>> j["sasl.jaas.config"]  # doctest: +NORMALIZE_WHITESPACE
        'org.apache.flink.kafka.shaded.org.apache.kafka.common.security.plain.PlainLoginModule required
         username="u" password="p";'
        """
        if self.protocol == "PLAINTEXT":
            return dict(self.flink_properties)
        props = {"security.protocol": self.protocol}
        if self.oauth:
            client_id, secret = self._login()
            scope = f' scope="{_jaas(self.oauth_scope)}"' if self.oauth_scope else ""
            props |= {"sasl.mechanism": "OAUTHBEARER",
                      "sasl.login.callback.handler.class":
                          SHADED_KAFKA + "common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
                      "sasl.oauthbearer.token.endpoint.url": self.oauth_endpoint(),
                      "sasl.jaas.config": f"{SHADED_KAFKA}common.security.oauthbearer.OAuthBearerLoginModule "
                                          f'required clientId="{_jaas(client_id)}" clientSecret="{_jaas(secret)}"'
                                          f"{scope};"}
        elif self.sasl:
            user, password = self._login()
            module = SHADED_KAFKA + ("common.security.plain.PlainLoginModule" if self.sasl_mechanism == "PLAIN"
                                     else "common.security.scram.ScramLoginModule")
            props |= {"sasl.mechanism": self.sasl_mechanism,
                      "sasl.jaas.config": f'{module} required username="{_jaas(user)}" password="{_jaas(password)}";'}
        if self.tls and self.ssl_ca_file is not None:
            props |= {"ssl.truststore.type": "PEM", "ssl.truststore.location": str(self.ssl_ca_file)}
        # A client certificate for the connector (one PEM file holding key and chain) goes in
        # flink_properties: ssl.keystore.type=PEM, ssl.keystore.location=FILE.
        return props | self.flink_properties


SHADED_KAFKA = "org.apache.flink.kafka.shaded.org.apache.kafka."  # where the Flink connector keeps Kafka


def _jaas(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


class KafkaSettings(Section):
    bootstrap_servers: str = "127.0.0.1:19092"
    security: KafkaSecuritySettings = KafkaSecuritySettings()
    topics: TopicSettings = TopicSettings()
    partitions: int = 2  # of the topics the pipeline creates
    # The samples topic's, when it differs: trainer ranks split its partitions, so it bounds how many
    # ranks can share the work (set it to trainer.autoscale.max_workers to scale the trainer out)
    samples_partitions: int | None = None
    linger_ms: int = 20
    batch_size_bytes: int = 1_000_000
    compression: str = "lz4"
    consumer_poll_batch: int = 5000


    def partitions_of(self) -> dict[str, int]:
        """The partition count the pipeline creates each of its topics with.

        >>> KafkaSettings(samples_partitions=20).partitions_of()["rtrec.samples"]
        20
        >>> set(KafkaSettings().partitions_of().values())
        {2}
        """
        counts = dict.fromkeys(self.topics.model_dump().values(), self.partitions)
        counts[self.topics.samples] = self.samples_partitions or self.partitions
        return counts


class RedisSettings(ClientCredentials):
    """Where the online features and the model pointer live. A secured Redis: an ACL user and its
    password (or `password_file`, read when connecting), and TLS with a `rediss://` URL, the CA that
    signed the server's certificate and, if the server asks for one, a client certificate and key.
    The password never appears in a printed setting (`SecretStr`, `redacted_url`)."""

    url: str = "redis://127.0.0.1:16379/0"
    key_prefix: str = "rtrec"
    # a key expires between ttl_s less min(ttl_s / 10, 60 s) and ttl_s after its last write
    # (feature_store/newest_wins.py); 0: never
    ttl_s: int = 86_400

    def connection_kwargs(self) -> dict[str, Any]:
        """The keyword arguments `redis.Redis.from_url(url, **kwargs)` needs beyond the URL.

        >>> RedisSettings(username="u", password="p").connection_kwargs()
        {'username': 'u', 'password': 'p'}
        >>> RedisSettings(ssl_ca_file="ca.pem").connection_kwargs()
        Traceback (most recent call last):
        ...
        ValueError: redis.ssl_ca_file/ssl_cert_file/ssl_key_file need a rediss:// URL (redis.url is redis://127.0.0.1:16379/0)
        """
        kwargs: dict[str, Any] = {}
        if self.username:
            kwargs["username"] = self.username
        secret = self.secret()
        if secret is not None:
            kwargs["password"] = secret
        tls = {"ssl_ca_certs": self.ssl_ca_file, "ssl_certfile": self.ssl_cert_file, "ssl_keyfile": self.ssl_key_file}
        tls = {k: str(v) for k, v in tls.items() if v is not None}
        if tls and not self.url.startswith("rediss://"):
            raise ValueError("redis.ssl_ca_file/ssl_cert_file/ssl_key_file need a rediss:// URL "
                             f"(redis.url is {self.redacted_url()})")
        return kwargs | tls

    def redacted_url(self) -> str:
        """The URL with any password in it replaced by `***`, for messages.

        >>> RedisSettings(url="rediss://app:s3cret@cache:6380/0").redacted_url()
        'rediss://app:***@cache:6380/0'
        """
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        user = parts.username or ""
        host = parts.hostname or ""
        netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port else "")
        return urlunsplit(parts._replace(netloc=netloc))


class SyntheticSettings(Section):
    """The demo's event generator (see rtrec/sources/synthetic.py for the model)."""

    seed: int = 7
    n_users: int = 500
    n_items: int = 2_000
    zipf_exponent: float = 1.1
    latent_dim: int = 8
    drift_per_hour: float = 0.5
    base_ctr: float = 0.05
    user_bias_std: float = 0.8  # some users click more than others
    item_bias_std: float = 0.8  # some items are more attractive
    like_rate: float = 0.2
    click_delay_mean_ms: int = 2_000
    out_of_order_fraction: float = 0.02
    out_of_order_max_ms: int = 2_000
    events_per_second_event_time: float = 200.0


class FlinkSettings(Section):
    """The feature jobs (flink_jobs/)."""

    parallelism: int = 1
    window_s: int = 3
    # Long horizons of the features topic; None: the feature set's (schemas/feature_set.py), which the
    # samples always use. A horizon's hop is its entry in horizon_slides_s, else window_s.
    horizons_s: tuple[int, ...] | None = None
    horizon_slides_s: dict[int, int] = Field(default_factory=lambda: {60: 3, 600: 30})
    # Per user's or item's tile, the smallest hashes of this many distinct counterparts: a horizon's
    # distinct count is exact while no tile saw more, within about 1/sqrt(this) beyond. 0: none kept, and
    # a read gets the most of any one tile (a lower bound).
    distinct_sketch_size: int = Field(default=64, ge=0, le=256)
    watermark_delay_ms: int = 2_000
    # A partition that sends nothing this long stops holding the watermark back. Flink's clock for it
    # runs while the task works on the other partitions' records, so a short timeout let a backlog or a
    # busy machine declare a partition idle that was only waiting its turn, and its on-time events were
    # dead-lettered as late (a live run under a CPU hog: every event of one partition's first 4 minutes).
    idle_timeout_ms: int = 30_000
    # Per partition and fetch: small enough that a backlog is read from all partitions in turn, not
    # one partition's megabyte (tens of thousands of events) at a time while the others wait.
    source_fetch_bytes: int = 65_536
    # How often sources emit watermarks and how long a half-full network buffer may wait: both add
    # directly to the time from a window's close to its record leaving the job.
    watermark_interval_ms: int = 50
    buffer_timeout_ms: int = 20
    checkpoint_interval_ms: int = 5_000
    # Kafka producer properties of the job's sinks, passed to the connector as properties.<name>;
    # kafka.security's are added after them. A setting replaces the whole dict. Batches of up to 1 MiB,
    # waiting up to 20 ms to fill: with Kafka's 16 KiB the job did 30k events/s from a backlog, with these
    # 39k, and the broker's CPU per event fell by two thirds (README "Sinks").
    sink_producer: dict[str, str] = Field(default_factory=lambda: {
        "linger.ms": "20", "batch.size": "1048576", "compression.type": "lz4"})
    # Any other Flink configuration for the job (e.g. {"pipeline.object-reuse": "false"} or
    # {"state.backend.type": "rocksdb"}), applied after the project's own, so it overrides them. From the
    # environment as JSON: RTREC_FLINK__CONFIG='{"state.backend.type": "rocksdb"}'.
    config: dict[str, str] = Field(default_factory=dict)
    # How often a bounded run (backfill, evaluate) says how far its sources have read (as committed on checkpoints)
    progress_every_s: float = Field(default=15.0, gt=0)
    checkpoint_failures_tolerated: int = 2  # consecutive; one more fails the job (then restarts count)
    # More than max_restarts failures within restart_window_s: the job ends FAILED and `features run`
    # exits 1 with the root cause, for a supervisor to act on (the default would retry forever, silently).
    max_restarts: int = 5
    restart_window_s: int = 600
    restart_delay_ms: int = 5_000
    job_metrics_port: int = 0  # > 0: `features run` serves Prometheus metrics (rtrec_job_*)
    attribution_window_s: int = 30
    # Samples per message of the samples topic: 1 writes a TrainingSample per message; more, blocks of up
    # to that many (TrainingSampleBlock, column by column), written whole at each checkpoint, so the trainer
    # takes a column at once instead of decoding a message per sample. Readers of the topic take both.
    samples_per_message: int = Field(default=1024, ge=1, le=65_536)
    # Each sample carries its user's newest engagements (clicks, likes, carts, orders) from before the
    # impression: at most history_length of them, none older than history_lookback_s. 0: none. The
    # online store gets the same lists per user (twice history_length kept; cut the same way on reads).
    history_length: int = Field(default=10, ge=0, le=100)
    history_lookback_s: int = Field(default=3600, gt=0)
    # The job forgets a user's list after this long without their engagements, in processing time, as
    # Flink's state TTL would. Entries older than history_lookback_s are dropped by event time anyway
    # (nothing reads them), so the state stays bounded with 0 (never) too.
    state_ttl_s: int = Field(default=86_400, ge=0)
    max_future_skew_ms: int = 3_600_000
    max_event_age_ms: int | None = None  # None: any age (historical replays); else older is malformed
    # Earlier event times are unit errors (seconds taken for milliseconds land in January 1970), not
    # history: 1980-01-01 by default, so public logs from the 1990s replay. `produce replay` checks it too.
    min_event_time_ms: int = 315_532_800_000
    max_event_bytes: int = 65_536  # a larger InteractionEvent value is dead-lettered undecoded
    max_id_length: int = 256  # event, user and item ids; longer ones are dead-lettered
    group_id: str = "rtrec-features"
    jvm_heap: str = "1g"
    checkpoint_dir: Path = Field(default_factory=lambda: _default_cache_dir() / "flink-checkpoints")
    log_dir: Path = Field(default_factory=lambda: _default_cache_dir() / "flink-logs")
    prebuilt_jars_dir: Path | None = None  # jars baked into an image; None: resolve with Maven, build the UDFs
    # A Flink 2.2 session cluster's REST endpoint, HOST:PORT, for `features submit/stop/rescale/status`;
    # None: the local cluster of `features cluster up` (127.0.0.1:18081)
    jobmanager: str | None = None
    # Where `features stop/rescale` write savepoints: a URI every node of that cluster reaches (s3://...,
    # a shared mount); None: <checkpoint_dir>/savepoints, right for a cluster on this machine
    savepoint_dir: str | None = None
    loader_group_id: str = "rtrec-redis-loader"
    loader_batch: int = 20_000
    loader_outage_s: float = 300.0  # Redis or Kafka unreachable this long: the loader exits non-zero
    loader_metrics_port: int = 0  # > 0: the loader serves Prometheus metrics (rtrec_loader_*)
    # A loader whose session ran out (Kafka was down longer than this) rejoins as a new member, and the
    # group coordinator waits for the old member's session to expire before it assigns partitions again:
    # with Kafka's 45 s default, Redis stopped receiving windows for up to 45 s after Kafka was back.
    loader_session_timeout_ms: int = 10_000
    # read_uncommitted: Redis sees a window as soon as the job sends it, not at the next checkpoint.
    # Safe because the job recomputes an aborted transaction's windows from the same events after
    # recovery, and a write for the same window end replaces the earlier one (newest window wins).
    # read_committed: Redis only ever holds committed windows, one checkpoint interval later.
    loader_isolation: Literal["read_uncommitted", "read_committed"] = "read_uncommitted"

    def hop_s(self, horizon_s: int) -> int:
        """How far a long horizon's window hops, the length of its tiles: its horizon_slides_s entry,
        else the base window."""
        return self.horizon_slides_s.get(horizon_s, self.window_s)

    @model_validator(mode="after")
    def _lists_outlive_their_lookback(self) -> FlinkSettings:
        if 0 < self.state_ttl_s < self.history_lookback_s:
            raise ValueError(f"flink.state_ttl_s ({self.state_ttl_s}) is shorter than flink.history_lookback_s "
                             f"({self.history_lookback_s}): the job would forget engagements the samples still read")
        return self


class AutoscaleSettings(Section):
    """How many trainer workers the consumer lag calls for (gpu_trainer/scaling.py): one per
    `lag_per_worker` messages, between `min_workers` and `max_workers`, never more than the samples
    topic has partitions. Up at once (after `up_cooldown_s`), down only when the lag is `down_margin`
    below the smaller count's threshold and `down_cooldown_s` have passed since the last change."""

    lag_per_worker: int = 1_000
    min_workers: int = 2
    max_workers: int = 20
    down_margin: float = 0.2
    up_cooldown_s: float = 30.0
    down_cooldown_s: float = 300.0


class TrainerSettings(Section):
    """The incremental trainer (gpu_trainer/)."""

    autoscale: AutoscaleSettings = AutoscaleSettings()

    group_id: str = "rtrec-trainer"
    # Static group membership: a restarted trainer takes its partitions back at once instead of
    # waiting for the killed one's session to time out.
    instance_id: str = "trainer-0"
    session_timeout_ms: int = 10_000
    # din: attention over the recent items, their event types and ages (needs history_length > 0)
    model: Literal["mf", "deepfm", "din"] = "mf"
    embedding_dim: int = 32
    user_buckets: int = 1 << 18
    item_buckets: int = 1 << 18
    hidden_dims: tuple[int, ...] = (128, 64)
    # How many of a sample's recent items (flink.history_length) the model reads: their item embeddings,
    # mean-pooled, join the user's side. 0: the model ignores them.
    history_length: int = Field(default=0, ge=0, le=100)
    batch_size: int = 4096
    batch_timeout_ms: int = 500
    # How far the samples consumer reads ahead of training (librdkafka's max.partition.fetch.bytes and
    # queued.min.messages; queued.max.messages.kbytes, 64 MiB by default, still bounds the memory).
    # librdkafka's defaults (1 MiB, 100,000) held consuming alone to about 110k samples/s from a
    # backlog here; these to about 200k (README, "The trainer").
    fetch_partition_max_bytes: int = Field(default=16 << 20, ge=1 << 16)
    prefetch_messages: int = Field(default=1_000_000, ge=1)
    max_id_length: int = 256  # a sample whose sample, user or item id is longer is dead-lettered
    lr: float = 0.01
    dense_lr: float = 0.02
    # Off by default, from the evaluations (README, "Choosing the update rule"): neither EMA nor EWC
    # beat plain updates on average, and EMA lost on every stream measured.
    ema_enabled: bool = False
    ema_momentum: float = 0.9
    ewc_enabled: bool = False
    ewc_lambda: float = 1.0
    ewc_fisher_momentum: float = 0.9
    ewc_consolidation_decay: float = 0.9
    eval_window: int = 20_000
    # With EMA on, the published weights are scored too (the promotion gate judges them), on this
    # many rows of each batch: enough for a steady AUC, a bounded cost on large batches.
    published_eval_rows: int = 1024
    # Shadow learners (gpu_trainer/shadow.py): update rules trained side by side on the same batches,
    # the gate publishing the one leading by prequential AUC; each costs a full training step.
    # Names: plain, ema, ewc, ema+ewc (their momentum and λ are those above). Empty: the one rule of
    # ema_enabled / ewc_enabled.
    shadow_variants: tuple[Literal["plain", "ema", "ewc", "ema+ewc"], ...] = ()
    # Under torchrun (gpu_trainer.distributed), what the ranks exchange each step: "samples" (each rank
    # steps on all of them: only ingest is split) or "gradients" (each rank steps on its own samples and
    # the gradients are summed: the step is split too). README, "Ranks", has the figures.
    rank_exchange: Literal["samples", "gradients"] = "samples"
    shadow_margin: float = 0.005
    snapshot_every_s: float = 10.0
    snapshot_every_samples: int = 100_000
    snapshot_dir: Path = Field(default_factory=lambda: _default_cache_dir() / "snapshots")
    keep_last: int = 5
    # After SIGTERM/SIGINT, how long the final snapshot may take before the process exits anyway
    shutdown_timeout_s: float = 60.0
    promotion_margin: float = 0.02
    metrics_port: int = 0  # 0: no Prometheus endpoint
    device: str = "auto"  # "auto", "cpu", "cuda" (under torchrun: the rank's own GPU) or "cuda:N"
    amp: str = "auto"  # "auto" (bf16 on CUDA), "bf16", "fp16", "off"
    # PyTorch's threads within an operation. None: the process's share of the cores (the ranks of
    # torchrun on this machine share them) less one, for the Kafka client's and the snapshot writer's
    # threads: on 2 cores with the broker beside it, torch's own 2 made both the step and the service
    # slower (README, "The trainer").
    torch_threads: int | None = Field(default=None, ge=1)
    seed: int = 0

    @model_validator(mode="after")
    def _din_reads_recent_items(self) -> TrainerSettings:
        if self.model == "din" and not self.history_length:
            raise ValueError("trainer.model din attends over the recent items: set trainer.history_length > 0 "
                             "(RTREC_TRAINER__HISTORY_LENGTH), at most flink.history_length")
        return self


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="RTREC_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    services: ServicesSettings = ServicesSettings()
    kafka: KafkaSettings = KafkaSettings()
    redis: RedisSettings = RedisSettings()
    synthetic: SyntheticSettings = SyntheticSettings()
    trainer: TrainerSettings = TrainerSettings()
    flink: FlinkSettings = FlinkSettings()

    def namespaced(self, run_id: str, topics: tuple[str, ...] | None = None, redis: bool = True) -> Settings:
        """The settings of one isolated run (demo, backfill, evaluation, benchmark): `topics` (roles,
        every one by default) suffixed `.<run_id>`, every consumer group, the checkpoint and snapshot
        directories, and (unless `redis=False`) the Redis key prefix of its own.

        >>> s = Settings().namespaced("r1", topics=("features",))
        >>> s.kafka.topics.features, s.kafka.topics.events, s.redis.key_prefix, s.trainer.snapshot_dir.name
        ('rtrec.features.r1', 'rtrec.interactions', 'rtrec:r1', 'snapshots-r1')
        """
        k, f, t = self.kafka, self.flink, self.trainer
        roles = set(topics if topics is not None else k.topics.model_dump())
        renamed = {role: f"{name}.{run_id}" for role, name in k.topics.model_dump().items() if role in roles}
        return self.model_copy(update={
            "kafka": k.model_copy(update={"topics": k.topics.model_copy(update=renamed)}),
            "redis": self.redis.model_copy(update={"key_prefix": f"{self.redis.key_prefix}:{run_id}"})
            if redis else self.redis,
            "flink": f.model_copy(update={"group_id": f"{f.group_id}-{run_id}",
                                          "checkpoint_dir": f.checkpoint_dir / run_id,
                                          "loader_group_id": f"{f.loader_group_id}-{run_id}"}),
            "trainer": t.model_copy(update={"group_id": f"{t.group_id}-{run_id}",
                                            "instance_id": f"{t.instance_id}-{run_id}",
                                            "snapshot_dir": t.snapshot_dir.with_name(
                                                f"{t.snapshot_dir.name}-{run_id}")}),
        })

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        toml_file = settings_cls.model_config.get("toml_file")
        sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
        if toml_file:
            sources += (TomlConfigSettingsSource(settings_cls, toml_file=toml_file),)
        return sources


def load_settings(config_file: str | Path | None = None, **overrides: object) -> Settings:
    """Settings from (highest first) `overrides`, `RTREC_*` env vars, then the TOML file.

    The file is `config_file`, else `$RTREC_CONFIG`, else none.
    """
    path = config_file or os.environ.get("RTREC_CONFIG")
    if not path:
        return Settings(**overrides)
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")

    class _FileSettings(Settings):
        model_config = SettingsConfigDict(toml_file=path)

    return _FileSettings(**overrides)
