"""Local Kafka (KRaft) and Redis processes for the demo and the tests; no Docker needed."""
