"""The Redis online feature store: newest-window-wins batched writes, batched reads with feature age,
and the loader that feeds it from the features topic. Uses `core` and `schemas`."""
