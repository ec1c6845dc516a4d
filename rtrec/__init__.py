"""rtrec: the CLI, local services, event sources, demo, backfill and evaluation that drive the
pipeline packages (the top: nothing below imports it)."""
