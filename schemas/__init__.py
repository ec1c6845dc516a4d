"""Data contracts: the Avro schemas (`avro/*.avsc`, the only copy of their text) and their serde."""
