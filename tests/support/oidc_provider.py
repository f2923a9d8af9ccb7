"""A real OpenID Connect provider on loopback for the dashboard's sign-in tests:
oidc-provider-mock (Flask over Authlib's server components) with known users, no network.

Besides honest sign-ins it can hand out the two tokens a relying party must refuse: a
forged ID token (its claims rewritten after the provider signed it) and an expired one (signed
by the provider, ``exp`` an hour ago). Both come from the same issuer and its one signing key
(the mock draws a key per app; both apps are handed the same one), so only the forgery or the
expiry can make the dashboard refuse them.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from unittest import mock

import oidc_provider_mock
import werkzeug.serving
from authlib import jose
from werkzeug.test import run_wsgi_app


@dataclass
class Provider:
    url: str
    mode: str = "honest"  # "honest", "forge" (claims rewritten) or "expired"
    forge_email: str = ""

    @property
    def metadata_url(self) -> str:
        return f"{self.url}/.well-known/openid-configuration"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def forge(id_token: str, email: str) -> str:
    """The same token with another e-mail in its claims and the provider's signature kept."""
    header, payload, signature = id_token.split(".")
    claims = json.loads(_unb64(payload))
    claims["email"] = email
    return ".".join([header, _b64(json.dumps(claims).encode()), signature])


def _call(app: Any, environ: dict) -> tuple[bytes, str, list[tuple[str, str]]]:
    body, status, headers = run_wsgi_app(app, environ, buffered=True)
    return b"".join(body), status, list(headers.items())


@contextmanager
def provider(users: dict[str, dict[str, Any]]) -> Iterator[Provider]:
    """Serve the provider on a free 127.0.0.1 port while the context lasts; ``users`` maps
    each subject to its ID-token claims (one button each on the provider's sign-in page)."""
    claims = [oidc_provider_mock.User(sub=sub, claims=c) for sub, c in users.items()]
    key = jose.RSAKey.generate_key(is_private=True)
    with mock.patch.object(jose.RSAKey, "generate_key", return_value=key):
        honest = oidc_provider_mock.app(user_claims=claims, require_nonce=True)
        expired = oidc_provider_mock.app(
            user_claims=claims, require_nonce=True, access_token_max_age=timedelta(hours=-1)
        )
    state = Provider(url="")

    def dispatch(environ: dict, start_response: Any) -> list[bytes]:
        path = environ.get("PATH_INFO", "")
        app = expired if state.mode == "expired" else honest
        if state.mode != "forge" or path != "/oauth2/token":
            return app(environ, start_response)
        body, status, headers = _call(app, environ)
        token = json.loads(body)
        if "id_token" in token:
            token["id_token"] = forge(token["id_token"], state.forge_email)
        body = json.dumps(token).encode()
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        start_response(status, [*headers, ("Content-Length", str(len(body)))])
        return [body]

    server = werkzeug.serving.make_server("127.0.0.1", 0, dispatch, threaded=True)
    state.url = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, args=(0.1,), daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
