"""rtrec: the CLI, settings and local services that drive the pipeline packages."""
