"""Data contracts: the Avro schemas (`avro/*.avsc`, the only copy of their text) and their serde, Avro
over Kafka (`kafka_io`), the sample's feature set (`feature_set`) and dead letters (`dead_letter`).
Uses `core` only."""
