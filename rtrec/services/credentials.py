"""What the local services run with when started secured (`rtrec services up --secure`): a CA and
certificates made for this state directory (openssl), the passwords of Kafka's admin, of the
pipeline's user and of its Redis user, each a file of its own (mode 600, in a 700 directory), and a
settings file (`client.toml`, with `client.env` beside it) that points every client at them.

Nothing here prints a password: the settings file holds password *files*, read when a client
connects, never the passwords themselves.
"""

from __future__ import annotations

import ipaddress
import json
import secrets
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.settings import ServicesSettings
from rtrec.services.process import ServiceError

PRIVATE = 0o600


class CredentialsError(ServiceError):
    """The credentials of the secured services could not be made."""


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise CredentialsError(f"openssl {args[0]} failed in {cwd}: {result.stderr.strip()[-500:]}")


def subject_alt_names(host: str) -> str:
    """The names a server certificate for `host` carries: the host itself, loopback and localhost.

    >>> subject_alt_names("127.0.0.1")
    'subjectAltName=IP:127.0.0.1,DNS:localhost'
    >>> subject_alt_names("kafka.internal")
    'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kafka.internal'
    """
    names = ["IP:127.0.0.1", "DNS:localhost"]
    try:
        extra = f"IP:{ipaddress.ip_address(host)}"
    except ValueError:
        extra = f"DNS:{host}"
    return "subjectAltName=" + ",".join(names + ([extra] if extra not in names else []))


def make_certs(d: Path, host: str = "127.0.0.1", days: int = 365) -> Path:
    """ca.pem, server.pem/server.key, client.pem/client.key and server-keystore.pem (key and chain in
    one file, the form Kafka's PEM keystore reads) in `d`, the keys mode 600; returns `d`."""
    if shutil.which("openssl") is None:
        raise CredentialsError("`openssl` is needed to make the certificates (Debian: apt-get install openssl)")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", str(days), "-subj", "/CN=rtrec-local-ca",
             "-keyout", "ca.key", "-out", "ca.pem", cwd=d)
    (d / "san.ext").write_text(subject_alt_names(host) + "\n")
    for name in ("server", "client"):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN=rtrec-{name}", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-days", str(days), "-out", f"{name}.pem", "-extfile", "san.ext", cwd=d)
    for scratch in ("san.ext", "ca.srl", "server.csr", "client.csr"):
        (d / scratch).unlink(missing_ok=True)
    keystore = d / "server-keystore.pem"
    keystore.write_text((d / "server.key").read_text() + (d / "server.pem").read_text())
    for key in (d / "ca.key", d / "server.key", d / "client.key", keystore):
        key.chmod(PRIVATE)
    return d


@dataclass(frozen=True)
class LocalCredentials:
    """The files of a secured local run, all in `dir`."""

    dir: Path

    @classmethod
    def of(cls, cfg: ServicesSettings) -> LocalCredentials:
        return cls(cfg.state_dir / "secure")

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def server_keystore(self) -> Path:
        return self.dir / "server-keystore.pem"

    @property
    def client_cert(self) -> Path:
        return self.dir / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.dir / "client.key"

    def password_file(self, who: str) -> Path:
        """`kafka-admin`, `kafka-user` or `redis-user`."""
        return self.dir / f"{who}.password"

    def password(self, who: str) -> str:
        return self.password_file(who).read_text().strip()

    @property
    def client_toml(self) -> Path:
        return self.dir / "client.toml"

    @property
    def client_env(self) -> Path:
        return self.dir / "client.env"

    def ensure(self, cfg: ServicesSettings) -> LocalCredentials:
        """Makes whatever is missing (kept across restarts: Kafka's users are written when its storage is
        formatted) and writes the clients' settings for `cfg`."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o700)
        if not self.server_keystore.exists():
            make_certs(self.dir, cfg.host)
        for who in ("kafka-admin", "kafka-user", "redis-user"):
            path = self.password_file(who)
            if not path.exists():
                path.touch(PRIVATE)
                path.write_text(secrets.token_urlsafe(24) + "\n")
        settings = self.client_settings(cfg)
        self.client_toml.write_text(to_toml(settings))
        self.client_env.write_text("".join(f"export {k}={json.dumps(v)}\n" for k, v in to_env(settings).items()))
        return self

    def client_settings(self, cfg: ServicesSettings) -> dict[str, Any]:
        """The settings every client of the secured local services needs (services, kafka, redis)."""
        user = cfg.secure.user
        return {
            "services": cfg.model_dump(mode="json"),
            "kafka": {"bootstrap_servers": f"{cfg.host}:{cfg.kafka_port}",
                      "security": {"protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512", "username": user,
                                   "password_file": str(self.password_file("kafka-user")),
                                   "ssl_ca_file": str(self.ca)}},
            "redis": {"url": f"rediss://{cfg.host}:{cfg.redis_port}/0", "username": user,
                      "password_file": str(self.password_file("redis-user")), "ssl_ca_file": str(self.ca),
                      "ssl_cert_file": str(self.client_cert), "ssl_key_file": str(self.client_key)},
        }


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def to_toml(tables: Mapping[str, Any], prefix: str = "") -> str:
    """Nested mappings as TOML tables (None values left out: TOML has no null).

    >>> print(to_toml({"kafka": {"bootstrap_servers": "h:1", "security": {"protocol": "SSL"}}}))
    [kafka]
    bootstrap_servers = "h:1"
    <BLANKLINE>
    [kafka.security]
    protocol = "SSL"
    <BLANKLINE>
    """
    out = []
    for name, table in tables.items():
        path = f"{prefix}{name}"
        scalars = {k: v for k, v in table.items() if not isinstance(v, Mapping) and v is not None}
        out.append(f"[{path}]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in scalars.items()))
        nested = {k: v for k, v in table.items() if isinstance(v, Mapping)}
        if nested:
            out.append(to_toml(nested, prefix=f"{path}."))
    return "\n".join(out)


def to_env(tables: Mapping[str, Any], prefix: str = "RTREC_") -> dict[str, str]:
    """The same settings as `RTREC_*` environment variables.

    >>> to_env({"kafka": {"security": {"protocol": "SSL"}, "partitions": 2}})
    {'RTREC_KAFKA__SECURITY__PROTOCOL': 'SSL', 'RTREC_KAFKA__PARTITIONS': '2'}
    """
    env: dict[str, str] = {}
    for name, value in tables.items():
        key = f"{prefix}{name.upper()}"
        if isinstance(value, Mapping):
            env |= to_env(value, prefix=key + "__")
        elif value is not None:
            env[key] = json.dumps(value) if isinstance(value, list | tuple | bool) else str(value)
    return env
