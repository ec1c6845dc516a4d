"""The jars a job needs: connectors from Maven (see core/maven.py) and this project's small
Java UDF jar, compiled with `javac` against the Flink jars of the pip package, once per source hash."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

import pyflink

from core.maven import jar_urls, resolve_jars

JAVA_SRC = Path(__file__).parent / "java"
FLINK_HOME = Path(pyflink.__file__).parent


def udf_jar(cache_dir: Path, flink_jar_dir: Path) -> Path:
    sources = sorted(JAVA_SRC.rglob("*.java"))
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sources)).hexdigest()[:16]
    target = cache_dir / "jars" / f"rtrec-flink-udfs-{digest}.jar"
    if target.exists():
        return target
    javac, jar = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar is None:
        raise RuntimeError("a JDK (javac, jar) is needed to build the job's UDF jar; install openjdk-17-jdk-headless")
    classpath = f"{FLINK_HOME / 'lib'}/*:{flink_jar_dir}/*"
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([javac, "-nowarn", "--release", "17", "-cp", classpath, "-d", out, *map(str, sources)],
                       check=True, capture_output=True, text=True)
        partial = target.with_suffix(".partial")
        subprocess.run([jar, "cf", str(partial), "-C", out, "."], check=True)
        partial.rename(target)
    return target


def job_jars(cache_dir: Path) -> list[str]:
    """`file://` URLs for `pipeline.jars`: Kafka connector, Avro, and the UDF jar."""
    flink_jars = resolve_jars("flink-pom.xml", cache_dir / "jars")
    return [*jar_urls(flink_jars), udf_jar(cache_dir, flink_jars).resolve().as_uri()]
