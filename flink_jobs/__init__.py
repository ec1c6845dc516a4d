"""PyFlink feature jobs: windowing and joins run in the JVM (Flink SQL), never in Python UDFs.
Uses `core` and `schemas`; never the trainer."""
