"""``fed-auc certs``: a pilot CA, the coordinator's TLS certificate and one key pair per site.

Layout of the output folder (what ``[flower] certs_dir`` and ``fed-auc node`` expect):
``ca.pem`` (give to every site), ``ca.key`` (keep offline), ``server.pem`` / ``server.key``
(the coordinator's), ``keys/<site>.key`` (give to that site only) and ``keys/<site>.pub``
(the coordinator registers these; a node whose key is not registered cannot join).
Flower's SuperNode verifies the server against the CA but presents no client certificate:
its identity is the site key (EC P-384, OpenSSH format, as Flower's node authentication
expects). For a pilot only: a production CA lives in the hospitals' PKI.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from fed_auc.io import save_text

VALID_DAYS = 365


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fed-auc pilot"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _write_secret(text: str, path: Path) -> None:
    save_text(text, path)
    path.chmod(0o600)


def _certificate(subject, issuer, public_key, signing_key, *, ca: bool, sans=()):
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_certs(out: str | Path, sites: Sequence[str], hosts: Sequence[str] = ()) -> Path:
    """Write the CA, a server certificate valid for ``hosts`` (+ localhost) and site keys."""
    out = Path(out)
    if not sites:
        raise ValueError("fed-auc certs: name at least one site (--site NAME)")
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_cert = _certificate(
        _name("fed-auc pilot CA"), _name("fed-auc pilot CA"), ca_key.public_key(), ca_key, ca=True
    )
    names = list(dict.fromkeys(["localhost", "127.0.0.1", "::1", *hosts]))
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = _certificate(
        _name(names[0] if not hosts else hosts[0]),
        ca_cert.subject,
        server_key.public_key(),
        ca_key,
        ca=False,
        sans=[_san(h) for h in names],
    )
    _write_secret(_pem_key(ca_key), out / "ca.key")
    save_text(ca_cert.public_bytes(serialization.Encoding.PEM).decode(), out / "ca.pem")
    _write_secret(_pem_key(server_key), out / "server.key")
    save_text(server_cert.public_bytes(serialization.Encoding.PEM).decode(), out / "server.pem")
    for site in sites:
        key = ec.generate_private_key(ec.SECP384R1())
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        _write_secret(private.decode(), out / "keys" / f"{site}.key")
        save_text(public.decode() + f" {site}\n", out / "keys" / f"{site}.pub")
    return out
