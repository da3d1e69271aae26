"""gateway.identity: who is calling, from a certificate or a trusted x-forwarded-client-cert
(the doors' side is tested with real certificates in tests/security/test_jobs_access.py and
tests/security/test_identity_forgery.py)."""

from __future__ import annotations

import pytest

from gateway import identity
from gateway.errors import GatewayError, Kind

SPIFFE = "spiffe://cluster.local/ns/shop/sa/checkout"
VICTIM = "spiffe://cluster.local/ns/ops/sa/admin"


def test_the_certificate_wins_over_any_header() -> None:
    header = f'By=spiffe://gw;URI="{SPIFFE}"'
    assert identity.caller("uri:spiffe://a", header, trust_xfcc=True) == "uri:spiffe://a"


@pytest.mark.parametrize("trust", [False, True])
def test_the_header_counts_only_when_trusted(trust: bool) -> None:
    header = f'By=spiffe://gw;Hash=abc;Subject="CN=x";URI={SPIFFE}'
    expected = f"uri:{SPIFFE}" if trust else "anonymous"
    assert identity.caller(None, header, trust_xfcc=trust) == expected


def test_nothing_is_anonymous() -> None:
    assert identity.caller(None, None, trust_xfcc=True) == identity.ANONYMOUS


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        # The last element is the one the nearest proxy wrote.
        (f"URI=spiffe://first,By=spiffe://gw;URI={SPIFFE}", f"uri:{SPIFFE}"),
        # Quoted values may hold the separators.
        ('Subject="CN=a,b;c";URI="spiffe://x/y"', "uri:spiffe://x/y"),
        ('By=spiffe://gw;Subject="OU=team,CN=worker-7"', "cn:worker-7"),
        ('Subject="CN=\\"quoted\\""', 'cn:"quoted"'),
        ('URI=spiffe://a,Subject="CN=\\",x\\""', 'cn:",x"'),
        ("By=spiffe://gw;Hash=abc", None),
        ("", None),
        (";;,,", None),
    ],
)
def test_xfcc_elements(header: str, expected: str | None) -> None:
    assert identity.from_xfcc(header) == expected


@pytest.mark.parametrize(
    "client_part",
    [
        f'URI={VICTIM};x="',  # an open quote meant to swallow the sidecar's comma
        f'URI="{VICTIM}',
        f'By=x;URI={VICTIM};Subject="CN=a\\',  # a trailing backslash escaping nothing
        f'URI={VICTIM}\\"',
        f'URI={VICTIM};x=",",URI={VICTIM};y="',
    ],
)
def test_the_clients_part_cannot_reach_into_the_sidecars_element(client_part: str) -> None:
    """Envoy's APPEND_FORWARD keeps what the client sent and appends its own element: only
    that element counts, whatever quotes the client left open."""
    sidecar = f'By=spiffe://cluster.local/ns/x/sa/gw;Hash=ab12;Subject="";URI={SPIFFE}'
    header = f"{client_part},{sidecar}"
    assert identity.caller(None, header, trust_xfcc=True) == f"uri:{SPIFFE}"
    assert identity.last_element(header) == sidecar


def test_a_uri_san_and_a_common_name_with_the_same_text_are_different_callers() -> None:
    by_uri = identity.from_peercert({"subjectAltName": (("URI", SPIFFE),)})
    by_cn = identity.from_peercert({"subject": (((("commonName", SPIFFE),),))})
    assert by_uri == f"uri:{SPIFFE}" and by_cn == f"cn:{SPIFFE}" and by_uri != by_cn
    assert identity.shown(by_uri) == f"URI SAN {SPIFFE}"
    assert identity.shown(by_cn) == f"CN={SPIFFE}"
    assert identity.shown(identity.ANONYMOUS) == "anonymous"


def test_auth_context_uri_san_first_then_common_name() -> None:
    both = {"x509_common_name": [b"cn-a"], "peer_uri": [SPIFFE.encode()], "peer_dns": [b"x"]}
    assert identity.from_auth_context(both) == f"uri:{SPIFFE}"
    assert identity.from_auth_context({"x509_common_name": [b"cn-c"]}) == "cn:cn-c"
    assert identity.from_auth_context({"transport_security_type": [b"ssl"]}) is None
    assert identity.from_auth_context({}) is None


def test_a_certificate_naming_nobody_is_refused_not_replaced_by_the_header() -> None:
    for nameless in (
        lambda: identity.from_auth_context({"x509_pem_cert": [b"-----BEGIN..."]}),
        lambda: identity.from_peercert({"subjectAltName": (("DNS", "x.example"),)}),
    ):
        with pytest.raises(GatewayError) as info:
            nameless()
        assert info.value.kind == Kind.PERMISSION_DENIED
        assert "neither a URI SAN nor a subject common name" in info.value.message


def test_peercert_as_ssl_decodes_it() -> None:
    cert = {
        "subject": ((("organizationName", "Org"),), (("commonName", "cn-a"),)),
        "subjectAltName": (("DNS", "x.example"), ("URI", SPIFFE)),
    }
    assert identity.from_peercert(cert) == f"uri:{SPIFFE}"
    assert identity.from_peercert({"subject": cert["subject"]}) == "cn:cn-a"
    assert identity.from_peercert({}) is None and identity.from_peercert(None) is None


def test_over_long_identities_are_refused_not_ignored() -> None:
    long = "spiffe://" + "a" * 2000
    for attempt in (
        lambda: identity.from_peercert({"subjectAltName": (("URI", long),)}),
        lambda: identity.from_auth_context({"peer_uri": [long.encode()]}),
        lambda: identity.caller(None, f"URI={long}", trust_xfcc=True),
    ):
        with pytest.raises(GatewayError) as info:
            attempt()
        assert info.value.kind == Kind.PERMISSION_DENIED
        assert "2009 characters" in info.value.message and "at most 1024" in info.value.message


def test_anonymous_callers_use_jobs_only_when_allowed() -> None:
    assert identity.for_jobs("cn:a", allow_anonymous=False) == "cn:a"
    assert identity.for_jobs(identity.ANONYMOUS, allow_anonymous=True) == identity.ANONYMOUS
    with pytest.raises(GatewayError) as info:
        identity.for_jobs(identity.ANONYMOUS, allow_anonymous=False)
    assert info.value.kind == Kind.PERMISSION_DENIED
    assert "client certificate" in info.value.message
    assert "GATEWAY_BATCH_ALLOW_ANONYMOUS" in info.value.message


@pytest.mark.parametrize(
    ("admins", "refusal"),
    [
        ("anonymous", "cannot be admins"),
        ("uri:spiffe://ops,anonymous", "cannot be admins"),
        (SPIFFE, "not a typed identity"),
        ("cn:", "not a typed identity"),
        ("ops", "not a typed identity"),
    ],
)
def test_admins_are_typed_identities_and_never_anonymous(admins: str, refusal: str) -> None:
    entries = [a.strip() for a in admins.split(",")]
    with pytest.raises(identity.AdminsError, match=refusal):
        identity.parse_admins(entries)
    assert identity.parse_admins([f"uri:{SPIFFE}", "cn:ops"]) == {f"uri:{SPIFFE}", "cn:ops"}


def test_operator_views_are_open_only_where_the_gateway_can_know_no_caller() -> None:
    laptop = identity.Operators([], callers_known=False)
    laptop.check(identity.ANONYMOUS, "rollout statistics")  # make run: anyone
    mesh = identity.Operators([], callers_known=True)
    with pytest.raises(GatewayError) as info:
        mesh.check(f"uri:{SPIFFE}", "rollout statistics")
    assert info.value.kind is Kind.PERMISSION_DENIED
    assert "GATEWAY_OPERATOR_IDENTITIES" in info.value.message
    ops = identity.Operators(["uri:spiffe://x/ops"], callers_known=True)
    ops.check("uri:spiffe://x/ops", "rollout statistics")
    for caller in (identity.ANONYMOUS, "cn:spiffe://x/ops"):
        with pytest.raises(GatewayError):
            ops.check(caller, "rollout statistics")
    with pytest.raises(identity.AdminsError, match="GATEWAY_OPERATOR_IDENTITIES entry 'ops'"):
        identity.Operators(["ops"], callers_known=False)
