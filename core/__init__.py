"""The bottom package: what every other package may use and that uses nothing of ours.

- `core.settings`: the one configuration object (env vars + TOML file);
- `core.maven`: resolves the Kafka broker and Flink connector jars from Maven Central into the cache;
- `core.log_range`: positions in an event log (times, per-partition offsets) and their parsing.
"""
