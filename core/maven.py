"""Resolves the jars named by a pom under `poms/` into the cache, once per pom content."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

POM_DIR = Path(__file__).parent / "poms"


class MavenError(RuntimeError):
    """Maven is missing or could not resolve a pom; the message says which and what to install."""


def resolve_jars(pom_name: str, jars_root: Path) -> Path:
    """Directory holding the pom's runtime jars; runs Maven only when the pom changed."""
    pom = POM_DIR / pom_name
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:16]
    target = jars_root / f"{pom.stem}-{digest}"
    if (target / ".complete").exists():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise MavenError(
            "Maven (`mvn`) is needed to fetch the Kafka and Flink jars; install it (Debian: apt-get install maven)."
        )
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
           "-DincludeScope=runtime", f"-DoutputDirectory={staging}"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        raise MavenError(f"Maven could not resolve {pom_name}:\n{result.stdout[-3000:]}{result.stderr[-2000:]}")
    (staging / ".complete").write_text(digest)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def classpath(jar_dir: Path) -> str:
    return str(jar_dir / "*")


def jar_urls(jar_dir: Path) -> list[str]:
    """`file://` URLs of every jar, for Flink's `pipeline.jars`."""
    return [p.resolve().as_uri() for p in sorted(jar_dir.glob("*.jar"))]


def resolve_all(jars_root: Path) -> dict[str, Path]:
    """Every pom's jars (the bootstrap calls this so the first `services up` does not wait on Maven)."""
    return {pom.name: resolve_jars(pom.name, jars_root) for pom in sorted(POM_DIR.glob("*.xml"))}


if __name__ == "__main__":
    from core.settings import load_settings

    for name, path in resolve_all(load_settings().services.jar_cache_dir).items():
        print(f"{name}: {path}")
