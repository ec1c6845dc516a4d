"""The feature job on a Flink 2.2 session cluster addressed by its REST endpoint (the user's own, or the
one `rtrec features cluster up` starts): submit it (`flink run -py`, the job graph built here, its jars
shipped with it; the task managers need no Python, every operator of the job runs in the JVM), find it,
stop it with a savepoint, and resubmit it from one at another parallelism."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

JOB_NAME = "rtrec-features"
JOB_FILE = Path(__file__).resolve().parent / "submit.py"
ENDED = ("FAILED", "CANCELED", "FINISHED")


class SessionClusterError(RuntimeError):
    pass


def flink_home() -> Path:
    import pyflink

    return Path(pyflink.__file__).parent


class SessionCluster:
    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        """`address`: HOST:PORT of the REST endpoint (or its http(s):// URL)."""
        self.url = (address if "://" in address else f"http://{address}").rstrip("/")
        self.address = self.url.split("://", 1)[1]
        self.timeout_s = timeout_s

    def _call(self, path: str, body: dict[str, Any] | None = None, method: str | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method or ("POST" if data else "GET"),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            said = exc.read().decode(errors="replace")[:500]
            raise SessionClusterError(f"{self.url}{path}: HTTP {exc.code} {said}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise SessionClusterError(f"no Flink cluster answers at {self.url}: {exc}") from exc
        return json.loads(text) if text else None

    def overview(self) -> dict[str, Any]:
        return self._call("/overview")

    def running_jobs(self) -> list[str]:
        """The ids of the feature jobs that have not ended."""
        jobs = self._call("/jobs/overview").get("jobs", [])
        return [j["jid"] for j in jobs if j.get("name") == JOB_NAME and j.get("state") not in ENDED]

    def the_job(self) -> str:
        jobs = self.running_jobs()
        if len(jobs) != 1:
            raise SessionClusterError(f"{self.url} runs {len(jobs)} feature jobs ({', '.join(jobs) or 'none'}); "
                                      "expected one")
        return jobs[0]

    def parallelism(self, job_id: str) -> int:
        return max(v["parallelism"] for v in self._call(f"/jobs/{job_id}")["vertices"])

    def submit(self, args: list[str], env: dict[str, str], parallelism: int | None = None,
               savepoint: str | None = None) -> str:
        """`flink run -py submit.py ARGS` against this cluster, detached; returns the job id. The job reads
        its settings from `env` (RTREC_* variables) as every rtrec command does."""
        cmd = ["bash", str(flink_home() / "bin" / "flink"), "run", "-m", self.address, "--detached",
               "-pyclientexec", sys.executable]
        if parallelism:
            # the job sets parallelism.default from its settings, over the client's flag
            cmd += ["--parallelism", str(parallelism)]
            env = {**env, "RTREC_FLINK__PARALLELISM": str(parallelism)}
        if savepoint:
            cmd += ["--fromSavepoint", savepoint]
        # An embedded PyFlink gateway in this process exports FLINK_* and JVM_ARGS: the client needs its own.
        clean = {k: v for k, v in os.environ.items() if not k.startswith("FLINK_") and k != "JVM_ARGS"}
        result = subprocess.run([*cmd, "-py", str(JOB_FILE), *args], capture_output=True, text=True,
                                env={**clean, "FLINK_HOME": str(flink_home()), **env})
        for line in result.stdout.splitlines():
            if "JobID" in line:
                return line.split()[-1]
        raise SessionClusterError(f"flink run against {self.url} failed ({result.returncode}):\n"
                                  f"{result.stdout[-3000:]}{result.stderr[-3000:]}")

    def stop_with_savepoint(self, job_id: str, target: str, timeout_s: float = 180.0) -> str:
        """Stops the job once a savepoint is written under `target` (a URI every cluster node reaches;
        without draining, so open windows stay in the savepoint and close after the resume). Returns the
        savepoint's location."""
        trigger = self._call(f"/jobs/{job_id}/stop", {"targetDirectory": target, "drain": False})["request-id"]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self._call(f"/jobs/{job_id}/savepoints/{trigger}")
            if status["status"]["id"] == "COMPLETED":
                operation = status.get("operation", {})
                if "failure-cause" in operation:
                    cause = operation["failure-cause"].get("stack-trace", "").splitlines()[:1]
                    raise SessionClusterError(f"stopping {job_id} with a savepoint failed: {' '.join(cause)}")
                return str(operation["location"])
            time.sleep(1)
        raise SessionClusterError(f"the savepoint of {job_id} did not complete within {timeout_s:.0f} s")

    def cancel(self, job_id: str) -> None:
        self._call(f"/jobs/{job_id}?mode=cancel", method="PATCH")
