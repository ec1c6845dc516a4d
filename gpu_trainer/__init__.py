"""The incremental trainer: Kafka micro-batches -> PyTorch -> versioned snapshots."""
