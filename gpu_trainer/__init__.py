"""The incremental trainer: micro-batches -> PyTorch -> versioned snapshots.

`service` runs the loop over the Protocols of `base`; `kafka_adapters` and `model_registry` are
their Kafka and Redis implementations; `publisher` writes and announces snapshots; `learner`,
`models/` and `updates/` are the maths. Uses `core`, `schemas` and `feature_store`; never the jobs.
"""
