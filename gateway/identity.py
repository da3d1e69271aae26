"""Who is calling: one identity per call, the same rules for every front door.

- The mTLS client certificate: its first URI SAN (a SPIFFE ID such as
  `spiffe://cluster.local/ns/shop/sa/checkout`), else its subject's common name. A
  certificate always wins: the header is not even read.
- Else, only with `trust_xfcc` (GATEWAY_TRUST_XFCC: a proxy in front, such as Istio's
  sidecar, that verified the client's certificate), `x-forwarded-client-cert`: the last
  element only, the one the nearest proxy appended (Envoy's APPEND_FORWARD keeps what the
  client sent and adds its own element after it), read without anything carried over from
  the client's part: its URI, else its subject's CN.
- Else "anonymous".

Every door reads it with the same function: `of_grpc` (a gRPC call's auth context and
metadata) and `of_http` (an aiohttp request's peer certificate and headers) hand the
certificate and every x-forwarded-client-cert value, in the order they came, to `caller`. A
proxy that appends (Envoy's APPEND_FORWARD, Istio's sidecar) puts its element last, after
anything the client sent, whether it joins values or adds a header; so the last element of
all the values joined is the only one a proxy vouched for, at the inference doors and the
jobs doors alike.

Identities are typed, so a URI SAN and a common name never collide: `uri:<URI SAN>` and
`cn:<common name>` (what records, logs and GATEWAY_BATCH_ADMINS hold); `shown` is the form
for people. "anonymous" has no type: no certificate can give it, and it is never an admin.
An identity over MAX_LENGTH characters is refused (PERMISSION_DENIED), not ignored.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from gateway.errors import GatewayError, Kind

ANONYMOUS = "anonymous"
XFCC = "x-forwarded-client-cert"
URI = "uri:"
CN = "cn:"
MAX_LENGTH = 1024  # no identity a certificate gives is longer; the store keys on it
# On a batch runner's calls (gRPC metadata): the typed identity of the job's owner, whose
# quota, fair share and payload log the images count under. Taken only from the callers
# GATEWAY_BATCH_RUNNER_IDENTITIES names (the runner pods the kubernetes executor starts).
JOB_OWNER = "x-vision-job-owner"


def caller(certificate: str | None, xfcc: str | None, trust_xfcc: bool) -> str:
    """The caller's typed identity from its certificate's (None without one) and the
    header's value (all its values joined by commas, in the order they came)."""
    if certificate:
        return certificate
    if trust_xfcc and xfcc:
        found = from_xfcc(xfcc)
        if found:
            return found
    return ANONYMOUS


def of_grpc(context: Any, trust_xfcc: bool) -> str:
    """The caller of a gRPC call (`grpc.aio.ServicerContext`): its client certificate, or the
    x-forwarded-client-cert metadata when trusted, or "anonymous"; PERMISSION_DENIED for a
    certificate or element naming an identity the gateway cannot take."""
    certificate = from_auth_context(context.auth_context())
    values = (
        value
        for key, value in context.invocation_metadata() or ()
        if key == XFCC and isinstance(value, str)
    )
    return caller(certificate, joined(values), trust_xfcc)


def of_http(request: Any, trust_xfcc: bool) -> str:
    """The caller of an HTTP request (`aiohttp.web.Request`), by the same rules as of_grpc."""
    transport = request.transport
    ssl_object = transport.get_extra_info("ssl_object") if transport is not None else None
    certificate = ssl_object.getpeercert() if ssl_object is not None else None
    return caller(from_peercert(certificate), joined(request.headers.getall(XFCC, ())), trust_xfcc)


def joined(values: Iterable[str]) -> str | None:
    """Several x-forwarded-client-cert headers as one value, as HTTP lets a proxy join them."""
    found = [v for v in values if v]
    return ",".join(found) if found else None


def for_jobs(identity: str, allow_anonymous: bool) -> str:
    """`identity`, when it may use batch jobs; PERMISSION_DENIED for "anonymous" unless
    GATEWAY_BATCH_ALLOW_ANONYMOUS (then every anonymous caller is one shared tenant)."""
    if identity == ANONYMOUS and not allow_anonymous:
        raise GatewayError(
            Kind.PERMISSION_DENIED,
            "batch jobs and uploads need a caller identity, and this call has none: call "
            "with a client certificate (mTLS: the gateway's GATEWAY_TLS_CLIENT_CA_FILE), or "
            "through a proxy that verified one (GATEWAY_TRUST_XFCC); an operator may set "
            "GATEWAY_BATCH_ALLOW_ANONYMOUS=true, which makes every caller without one share "
            "one tenant (each sees, cancels and deletes the others' jobs and uploads)",
        )
    return identity


def shown(identity: str) -> str:
    """An identity as people read it: `URI SAN spiffe://...`, `CN=worker-7`, `anonymous`."""
    if identity.startswith(URI):
        return f"URI SAN {identity.removeprefix(URI)}"
    if identity.startswith(CN):
        return f"CN={identity.removeprefix(CN)}"
    return identity


class AdminsError(ValueError):
    """GATEWAY_BATCH_ADMINS names something that is not a typed identity (refused at start)."""


def parse_admins(
    entries: Iterable[str], setting: str = "GATEWAY_BATCH_ADMINS", role: str = "admins"
) -> frozenset[str]:
    """A setting's identities (GATEWAY_BATCH_ADMINS, GATEWAY_OPERATOR_IDENTITIES), each typed
    (`uri:...` or `cn:...`); AdminsError for anything else, "anonymous" included."""
    admins = set()
    for entry in entries:
        if entry == ANONYMOUS:
            raise AdminsError(
                f"{setting} names 'anonymous': callers without an identity cannot be {role}"
            )
        kind = URI if entry.startswith(URI) else CN if entry.startswith(CN) else ""
        if not kind or not entry.removeprefix(kind) or len(entry) > len(kind) + MAX_LENGTH:
            raise AdminsError(
                f"{setting} entry {entry!r} is not a typed identity: write "
                "uri:<URI SAN> (e.g. uri:spiffe://cluster.local/ns/ops/sa/admin) or "
                "cn:<certificate common name>"
            )
        admins.add(entry)
    return frozenset(admins)


class Operators:
    """Who may read operator views (rollout statistics): the identities of
    GATEWAY_OPERATOR_IDENTITIES. With none set, a gateway that can know no caller (no client
    CA, no trusted x-forwarded-client-cert: a laptop's `make run`) lets anyone read them, and
    one that can know callers lets no one."""

    def __init__(self, entries: Iterable[str], callers_known: bool) -> None:
        setting = "GATEWAY_OPERATOR_IDENTITIES"
        self.identities = parse_admins(entries, setting, "operators")
        self.open = not self.identities and not callers_known

    def check(self, identity: str, what: str) -> None:
        """PERMISSION_DENIED unless `identity` may read `what`."""
        if self.open or identity in self.identities:
            return
        if not self.identities:
            fix = "an operator may list identities in GATEWAY_OPERATOR_IDENTITIES"
        elif identity == ANONYMOUS:
            fix = (
                "call with a client certificate (mTLS), or through a proxy that verified one, "
                "naming an identity in GATEWAY_OPERATOR_IDENTITIES"
            )
        else:
            fix = f"{shown(identity)} is not in GATEWAY_OPERATOR_IDENTITIES"
        raise GatewayError(Kind.PERMISSION_DENIED, f"{what} are for the gateway's operators: {fix}")


def runner_identities(setting: str) -> frozenset[str]:
    """GATEWAY_BATCH_RUNNER_IDENTITIES (comma-separated typed identities) as a set."""
    return _runners(setting)


@lru_cache(maxsize=4)
def _runners(setting: str) -> frozenset[str]:
    entries = (p.strip() for p in setting.split(",") if p.strip())
    return parse_admins(entries, "GATEWAY_BATCH_RUNNER_IDENTITIES", "batch runners")


def on_behalf(caller: str, owner: str | None, runners: frozenset[str]) -> str:
    """Who a call counts as: `caller`, or the job owner a batch runner names (`owner`, the
    x-vision-job-owner header) when `caller` is one of `runners`. A caller that is no runner
    naming an owner is refused (PERMISSION_DENIED), never taken at its word: only the runner
    pods the gateway starts carry another caller's identity."""
    if owner is None:
        return caller
    if caller not in runners:
        raise GatewayError(
            Kind.PERMISSION_DENIED,
            f"{JOB_OWNER} is set by the gateway's batch runners only, and {shown(caller)} is "
            "not one of them (GATEWAY_BATCH_RUNNER_IDENTITIES); call without it",
        )
    kind = URI if owner.startswith(URI) else CN if owner.startswith(CN) else ""
    typed = bool(kind) and 0 < len(owner) - len(kind) <= MAX_LENGTH
    if owner != ANONYMOUS and not typed:
        raise GatewayError(
            Kind.PERMISSION_DENIED,
            f"{JOB_OWNER} must be a typed identity (uri:..., cn:...) or anonymous",
        )
    if any(ord(c) < 0x20 or c == "\x7f" for c in owner):
        raise GatewayError(Kind.PERMISSION_DENIED, f"{JOB_OWNER} holds control characters")
    return owner


def from_auth_context(auth: Mapping[str, Sequence[bytes]]) -> str | None:
    """The identity in a gRPC auth context (`context.auth_context()`); None without a
    client certificate."""
    for key, kind in (("peer_uri", URI), ("x509_common_name", CN)):
        values = auth.get(key) or ()
        if values:
            return _typed(kind, bytes(values[0]).decode(errors="replace"), "client certificate")
    if auth.get("x509_pem_cert") or auth.get("x509_subject"):
        raise _nameless()
    return None


def from_peercert(cert: Mapping[str, Any] | None) -> str | None:
    """The identity in a certificate as `ssl.SSLSocket.getpeercert()` decodes it; None
    without one."""
    if not cert:
        return None
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "URI":
            return _typed(URI, str(value), "client certificate")
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return _typed(CN, str(value), "client certificate")
    raise _nameless()


def from_xfcc(header: str) -> str | None:
    """The identity in the last element of an x-forwarded-client-cert value (Envoy's format:
    elements separated by commas, `key=value` pairs by semicolons, values optionally in
    double quotes with backslash escapes); None when that element names none."""
    pairs = _split(last_element(header), ";")
    fields: dict[str, str] = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        key = key.strip().lower()
        if key and key not in fields:
            fields[key] = _unquote(value.strip())
    if fields.get("uri"):
        return _typed(URI, fields["uri"], XFCC)
    for part in _split(fields.get("subject", ""), ","):
        key, _, value = part.partition("=")
        if key.strip().upper() == "CN" and value.strip():
            return _typed(CN, value.strip(), XFCC)
    return None


def last_element(header: str) -> str:
    """The header's last element, found from the end: the text after the last comma outside
    the element's own quotes. Whatever the client put before it (an open quote included)
    cannot change where it starts."""
    quoted = False
    index = len(header)
    while index > 0:
        index -= 1
        char = header[index]
        if char == '"' and not _escaped(header, index):
            quoted = not quoted
        elif char == "," and not quoted:
            return header[index + 1 :].strip()
    return header.strip()


def _escaped(text: str, index: int) -> bool:
    """True when text[index] follows an odd run of backslashes."""
    run = 0
    while index - run - 1 >= 0 and text[index - run - 1] == "\\":
        run += 1
    return run % 2 == 1


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


def _nameless() -> GatewayError:
    # A client with a certificate talks to the gateway directly: a header it sends is its
    # own, so it never stands in for the certificate.
    return GatewayError(
        Kind.PERMISSION_DENIED,
        "the client certificate has neither a URI SAN nor a subject common name, so it names "
        "no caller: use a certificate with one",
    )


def _typed(kind: str, identity: str, source: str) -> str | None:
    identity = identity.strip()
    if not identity:
        return None
    if len(identity) > MAX_LENGTH:
        what = "URI SAN" if kind == URI else "common name"
        raise GatewayError(
            Kind.PERMISSION_DENIED,
            f"the {source}'s {what} is {len(identity)} characters; the gateway takes "
            f"identities of at most {MAX_LENGTH}: use a certificate with a shorter one",
        )
    if any(ord(c) < 0x20 or c == "\x7f" for c in identity):
        raise GatewayError(
            Kind.PERMISSION_DENIED,
            f"the {source}'s {kind.rstrip(':').upper()} holds control characters; "
            "use a certificate whose identity is printable text",
        )
    return kind + identity
