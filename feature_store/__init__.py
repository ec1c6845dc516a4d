"""The Redis online feature store: newest-window-wins batched writes, batched reads with feature age."""
