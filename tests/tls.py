"""Certificates for one test run, from openssl: a CA, a server certificate for 127.0.0.1 and a client
certificate, both signed by it (PEM files in one directory)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d: Path) -> Path:
    """ca.pem, server.pem/server.key, client.pem/client.key and server-keystore.pem (key and chain in
    one file, the form Kafka's PEM keystore reads) in `d`; returns `d`."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=rtrec-test-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=rtrec-{name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", "1", "-out", f"{name}.pem", "-extfile", "san.ext", cwd=d)
    (d / "server-keystore.pem").write_text((d / "server.key").read_text() + (d / "server.pem").read_text())
    return d
