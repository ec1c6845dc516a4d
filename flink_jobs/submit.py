"""Entry file for `flink run -py flink_jobs/submit.py`: the same job, on a standalone cluster.

Settings come from RTREC_* env vars and `--config FILE`, as for the CLI. `--resume` restores the newest
retained checkpoint under the checkpoint directory; `--running-on URL` (no Flink needed) only answers,
by its exit status, whether that cluster already runs the job: a session cluster without HA forgets its
jobs when its jobmanager restarts, and the compose stack's keeper then resubmits with `--resume`.
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
    parser.add_argument("--resume", action="store_true", help="restore the newest retained checkpoint")
    parser.add_argument("--running-on", metavar="REST_URL",
                        help="exit 0 if that cluster runs the job, 1 if not, 2 if it cannot be asked")
    args = parser.parse_args()
    if args.running_on:
        running = job_running(args.running_on)
        sys.exit(2 if running is None else 0 if running else 1)
    settings = load_settings(args.config)
    t_env = table_environment(settings)
    if args.resume:
        from flink_jobs.runner import latest_checkpoint

        checkpoint = latest_checkpoint(settings.flink.checkpoint_dir)
        if checkpoint is not None:
            print(f"resuming from checkpoint {checkpoint}", flush=True)
            t_env.get_config().set("execution.state-recovery.path", str(checkpoint))
    build_job(settings, t_env, job_id=args.job_id, with_samples=not args.no_samples).execute()


def job_running(rest_url: str, name: str = "rtrec-features") -> bool | None:
    """Whether the cluster at `rest_url` has a job called `name` that has not ended; None when the cluster
    does not answer (a busy jobmanager may still run it: submitting then could run the job twice)."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{rest_url.rstrip('/')}/jobs/overview", timeout=5) as response:
            jobs = json.load(response).get("jobs", [])
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"cannot ask {rest_url} for its jobs: {exc}", file=sys.stderr)
        return None
    return any(j.get("name") == name and j.get("state") not in ENDED for j in jobs)


ENDED = frozenset({"FAILED", "CANCELED", "FINISHED", "SUSPENDED"})


if __name__ == "__main__":
    main()
