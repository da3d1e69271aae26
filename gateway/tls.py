"""TLS from PEM files, in one place: the gateway's own port (gRPC credentials and the HTTP
door's SSL context, mTLS with a client CA), and client channels (to TF Serving, and the
client and batch runner to the gateway).

A file that cannot be read fails with OSError naming its flag, before anything serves.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

import grpc

from gateway.config import Settings


def read_pem(path: str, setting: str) -> bytes:
    """A certificate or key file named by a setting; OSError naming the setting otherwise."""
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise OSError(f"cannot read {setting} {path!r}: {exc.strerror or exc}") from None


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS for the gateway's gRPC port (mTLS with a client CA); None for plaintext."""
    if not settings.tls_cert_file:
        return None
    cert = read_pem(settings.tls_cert_file, "tls-cert-file")
    key = read_pem(settings.tls_key_file, "tls-key-file")
    client_ca = None
    if settings.tls_client_ca_file:
        client_ca = read_pem(settings.tls_client_ca_file, "tls-client-ca-file")
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def server_ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """TLS on the HTTP port with the gRPC port's certificate (mTLS with its client CA)."""
    if not settings.tls_cert_file:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    # The chain and key load from their paths (ssl reads no PEM from memory for them); the
    # gRPC port's credentials have read both already, failing with the flag's name.
    context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
    if settings.tls_client_ca_file:
        ca = read_pem(settings.tls_client_ca_file, "tls-client-ca-file")
        context.load_verify_locations(cadata=ca.decode("ascii", errors="replace"))
        context.verify_mode = ssl.CERT_REQUIRED
    return context


@dataclass(frozen=True)
class TLS:
    """TLS for a client channel: a CA bundle (None: the system roots), a client certificate
    and key for mTLS, and the name to expect in the server's certificate (None: the
    target's host)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def credentials(self, flags: str = "") -> grpc.ChannelCredentials:
        """The channel credentials; an unreadable file is named as the flag `flags` +
        "ca-file" (or "cert-file", "key-file")."""

        def read(path: str | None, flag: str) -> bytes | None:
            return read_pem(path, flags + flag) if path else None

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file, "ca-file"),
            private_key=read(self.key_file, "key-file"),
            certificate_chain=read(self.cert_file, "cert-file"),
        )

    def channel_options(self) -> list[tuple[str, Any]]:
        """The channel options TLS needs: the name to expect, when it is not the target's."""
        return [("grpc.ssl_target_name_override", self.server_name)] if self.server_name else []
