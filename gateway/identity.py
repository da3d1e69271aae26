"""Who is calling: one identity per call, the same rules for every front door.

- The mTLS client certificate: its first URI SAN (a SPIFFE ID such as
  `spiffe://cluster.local/ns/shop/sa/checkout`), else its subject's common name.
- Else, only with `trust_xfcc` (GATEWAY_TRUST_XFCC: a proxy in front, such as Istio's
  sidecar, overwrites the header), `x-forwarded-client-cert`: the URI of its last element
  (the one the nearest proxy wrote), else that element's subject CN.
- Else "anonymous".

The doors hand over what their transport gives: gRPC its auth context, HTTP the peer
certificate as `ssl` decodes it; both the header's value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ANONYMOUS = "anonymous"
XFCC = "x-forwarded-client-cert"
MAX_LENGTH = 1024  # an identity longer than this is not one a certificate gives


def caller(certificate: str | None, xfcc: str | None, trust_xfcc: bool) -> str:
    """The caller's identity from its certificate's (None without one) and the header."""
    if certificate:
        return certificate
    if trust_xfcc and xfcc:
        found = from_xfcc(xfcc)
        if found:
            return found
    return ANONYMOUS


def from_auth_context(auth: Mapping[str, Sequence[bytes]]) -> str | None:
    """The identity in a gRPC auth context (`context.auth_context()`); None without a
    client certificate."""
    for key in ("peer_uri", "x509_common_name"):
        values = auth.get(key) or ()
        if values:
            return _bounded(bytes(values[0]).decode(errors="replace"))
    return None


def from_peercert(cert: Mapping[str, Any] | None) -> str | None:
    """The identity in a certificate as `ssl.SSLSocket.getpeercert()` decodes it; None
    without one."""
    if not cert:
        return None
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "URI":
            return _bounded(str(value))
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return _bounded(str(value))
    return None


def from_xfcc(header: str) -> str | None:
    """The identity in an x-forwarded-client-cert value (Envoy's format: elements separated
    by commas, `key=value` pairs by semicolons, values optionally in double quotes)."""
    elements = _split(header, ",")
    if not elements:
        return None
    pairs = _split(elements[-1], ";")
    fields: dict[str, str] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        key = key.strip().lower()
        if key and key not in fields:
            fields[key] = _unquote(value.strip())
    if fields.get("uri"):
        return _bounded(fields["uri"])
    for part in _split(fields.get("subject", ""), ","):
        key, _, value = part.partition("=")
        if key.strip().upper() == "CN" and value.strip():
            return _bounded(value.strip())
    return None


def _split(text: str, separator: str) -> list[str]:
    """`text` split at `separator` outside double quotes (a backslash escapes a quote)."""
    parts, current, quoted, escaped = [], [], False, False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            current.append(char)
            escaped = True
        elif char == '"':
            current.append(char)
            quoted = not quoted
        elif char == separator and not quoted:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1].replace('\\"', '"')
    return value


def _bounded(identity: str) -> str | None:
    identity = identity.strip()
    return identity if 0 < len(identity) <= MAX_LENGTH else None
