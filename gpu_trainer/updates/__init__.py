"""Incremental-update maths (no Kafka, no I/O): EMA of weights and online EWC."""
