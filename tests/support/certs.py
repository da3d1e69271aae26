"""Test certificates made on the fly: a CA, a server certificate (for localhost and 127.0.0.1
unless other names are asked for), and a client certificate, all signed by the CA (EC P-256,
valid for a day); more named client certificates on request (each with a URI SAN such as a
SPIFFE ID, or a common name only). The one certificate builder of the tests."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server: Pair
    client: Pair
    clients: Mapping[str, Pair] = field(default_factory=dict)  # the named ones


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(
    directory: Path, stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Pair:
    pair = Pair(directory / f"{stem}.crt", directory / f"{stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return pair


def _builder(
    subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _subject_name(name: str) -> x509.GeneralName:
    """An IP address entry for an address, a DNS name entry otherwise."""
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def make_certificates(
    directory: Path,
    ca_name: str = "test CA",
    clients: Mapping[str, str] = {},
    server_names: Sequence[str] = ("localhost", "127.0.0.1"),
    common_names: Mapping[str, str] = {},
) -> Certificates:
    """Writes ca.crt, server.crt/.key (valid for `server_names`: host names and IP addresses)
    and client.crt/.key; and for each of `clients` (name -> URI SAN, or "" for a certificate
    with its common name only) <name>.crt/.key with that name as its common name (or the
    one `common_names` gives it)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        _builder(ca_name, _name(ca_name), ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    ca_path = directory / "ca.crt"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

    def leaf(stem: str, usage: x509.ObjectIdentifier, names: list[x509.GeneralName]) -> Pair:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            _builder(common_names.get(stem, stem), ca_cert.subject, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if names:
            cert = cert.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return _write(directory, stem, cert.sign(ca_key, hashes.SHA256()), key)

    server = leaf(
        "server", ExtendedKeyUsageOID.SERVER_AUTH, [_subject_name(n) for n in server_names]
    )
    client = leaf("client", ExtendedKeyUsageOID.CLIENT_AUTH, [x509.DNSName("gateway-client")])
    named = {
        name: leaf(
            name,
            ExtendedKeyUsageOID.CLIENT_AUTH,
            [x509.UniformResourceIdentifier(uri)] if uri else [],
        )
        for name, uri in clients.items()
    }
    return Certificates(ca_path, server, client, named)
