"""Event sources for the interactions topic: the synthetic generator and log replay."""
