"""A small OIDC provider for tests, over HTTP on loopback: the client-credentials grant at /token (HTTP
Basic or form credentials, as OAuth 2 allows both) issuing RS256 JWTs, and the signing key at /jwks for
the broker's validator. The RSA key and every signature come from openssl; the standard library does
the rest."""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Provider:
    def __init__(self, home: Path, client_id: str, client_secret: str) -> None:
        self.key = home / "oidc-signing.key"
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048",
                        "-out", str(self.key)], check=True, capture_output=True)
        modulus = subprocess.run(["openssl", "rsa", "-in", str(self.key), "-noout", "-modulus"], check=True,
                                 capture_output=True, text=True).stdout.strip().split("=", 1)[1]
        self.jwks = {"keys": [{"kty": "RSA", "kid": "test-key", "use": "sig", "alg": "RS256",
                               "n": b64url(bytes.fromhex(modulus)), "e": b64url((65537).to_bytes(3, "big"))}]}
        self.client_id, self.client_secret = client_id, client_secret
        self.issued: list[str] = []  # the subjects tokens were issued to
        self.refused = 0

    def token(self, subject: str) -> str:
        now = int(time.time())
        header = b64url(json.dumps({"alg": "RS256", "typ": "JWT", "kid": "test-key"}).encode())
        claims = b64url(json.dumps({"sub": subject, "iat": now, "exp": now + 3600, "iss": "rtrec-test",
                                    "scope": "kafka"}).encode())
        signing_input = f"{header}.{claims}".encode()
        signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)], input=signing_input,
                                   check=True, capture_output=True).stdout
        return f"{header}.{claims}.{b64url(signature)}"

    def credentials(self, headers: dict[str, str], form: dict[str, list[str]]) -> tuple[str, str]:
        auth = headers.get("Authorization", "")
        if auth.startswith("Basic "):
            user, _, secret = base64.b64decode(auth[6:]).decode().partition(":")
            return urllib.parse.unquote(user), urllib.parse.unquote(secret)
        return form.get("client_id", [""])[0], form.get("client_secret", [""])[0]


def _handler(provider: Provider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (the name http.server calls)
            if self.path.startswith("/jwks"):
                self._send(200, provider.jwks)
            else:
                self._send(404, {"error": "not_found"})

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", 0))
            form = urllib.parse.parse_qs(self.rfile.read(length).decode())
            client_id, secret = provider.credentials(dict(self.headers), form)
            if form.get("grant_type") != ["client_credentials"] or (client_id, secret) != (
                    provider.client_id, provider.client_secret):
                provider.refused += 1
                self._send(401, {"error": "invalid_client"})
                return
            provider.issued.append(client_id)
            self._send(200, {"access_token": provider.token(client_id), "token_type": "Bearer",
                             "expires_in": 3600})

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
            pass

    return Handler


@contextmanager
def oidc_provider(home: Path, client_id: str, client_secret: str) -> Iterator[tuple[Provider, str]]:
    """(provider, base URL) while the server runs."""
    provider = Provider(home, client_id, client_secret)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(provider))
    thread = threading.Thread(target=server.serve_forever, daemon=True, name="oidc-provider")
    thread.start()
    try:
        yield provider, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
