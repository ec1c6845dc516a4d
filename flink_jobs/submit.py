"""Entry file for `flink run -py flink_jobs/submit.py`: the same job, on a standalone cluster.

Settings come from RTREC_* env vars and `--config FILE`, as for the CLI.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the cluster's client runs this as a script


def main() -> None:
    from core.settings import load_settings
    from flink_jobs.environment import table_environment
    from flink_jobs.feature_job import build_job

    parser = argparse.ArgumentParser(description="rtrec feature job")
    parser.add_argument("--config", default=None)
    parser.add_argument("--no-samples", action="store_true")
    parser.add_argument("--job-id", default="features-cluster")
    args = parser.parse_args()
    settings = load_settings(args.config)
    t_env = table_environment(settings)
    build_job(settings, t_env, job_id=args.job_id, with_samples=not args.no_samples).execute()


if __name__ == "__main__":
    main()
