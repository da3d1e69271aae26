"""gateway.identity: who is calling, from a certificate or a trusted x-forwarded-client-cert
(the doors' side is tested with real certificates in tests/security/test_jobs_access.py)."""

from __future__ import annotations

import pytest

from gateway import identity

SPIFFE = "spiffe://cluster.local/ns/shop/sa/checkout"


def test_the_certificate_wins_over_any_header() -> None:
    header = f'By=spiffe://gw;URI="{SPIFFE}"'
    assert identity.caller("spiffe://a", header, trust_xfcc=True) == "spiffe://a"


@pytest.mark.parametrize("trust", [False, True])
def test_the_header_counts_only_when_trusted(trust: bool) -> None:
    header = f'By=spiffe://gw;Hash=abc;Subject="CN=x";URI={SPIFFE}'
    assert identity.caller(None, header, trust_xfcc=trust) == (SPIFFE if trust else "anonymous")


def test_nothing_is_anonymous() -> None:
    assert identity.caller(None, None, trust_xfcc=True) == identity.ANONYMOUS


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        # The last element is the one the nearest proxy wrote.
        (f"URI=spiffe://first,By=spiffe://gw;URI={SPIFFE}", SPIFFE),
        # Quoted values may hold the separators.
        ('Subject="CN=a,b;c";URI="spiffe://x/y"', "spiffe://x/y"),
        ('By=spiffe://gw;Subject="OU=team,CN=worker-7"', "worker-7"),
        ('Subject="CN=\\"quoted\\""', '"quoted"'),
        ("By=spiffe://gw;Hash=abc", None),
        ("", None),
        (";;,,", None),
    ],
)
def test_xfcc_elements(header: str, expected: str | None) -> None:
    assert identity.from_xfcc(header) == expected


def test_auth_context_uri_san_first_then_common_name() -> None:
    both = {"x509_common_name": [b"cn-a"], "peer_uri": [SPIFFE.encode()], "peer_dns": [b"x"]}
    assert identity.from_auth_context(both) == SPIFFE
    assert identity.from_auth_context({"x509_common_name": [b"cn-c"]}) == "cn-c"
    assert identity.from_auth_context({"transport_security_type": [b"ssl"]}) is None
    assert identity.from_auth_context({}) is None


def test_peercert_as_ssl_decodes_it() -> None:
    cert = {
        "subject": ((("organizationName", "Org"),), (("commonName", "cn-a"),)),
        "subjectAltName": (("DNS", "x.example"), ("URI", SPIFFE)),
    }
    assert identity.from_peercert(cert) == SPIFFE
    assert identity.from_peercert({"subject": cert["subject"]}) == "cn-a"
    assert identity.from_peercert({}) is None and identity.from_peercert(None) is None


def test_absurdly_long_identities_are_not_identities() -> None:
    long = "spiffe://" + "a" * 2000
    assert identity.from_xfcc(f"URI={long}") is None
    assert identity.caller(None, f"URI={long}", trust_xfcc=True) == "anonymous"
