"""Identities that cannot be forged (issue 33 item 3), through the real doors: gRPC with real
client certificates, HTTP with curl, and a plaintext gateway that trusts
x-forwarded-client-cert with the test playing the sidecar in front of it (Envoy's
APPEND_FORWARD: the client's own value, then the sidecar's element after a comma).

Rows of the attack table in docs/security.md, each proved by the test named after it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from google.longrunning import operations_pb2 as lro

from gateway.proto.vision.v1 import batch_pb2 as bpb
from tests.support import tools
from tests.support.certs import make_certificates
from tests.support.jobs import MODEL_CONFIG, Client, channel, gateway, make_images, metadata
from tests.support.localserver import LocalServer

ALICE = "spiffe://test.local/ns/shop/sa/alice"
BOB = "spiffe://test.local/ns/shop/sa/bob"
ADMIN = "spiffe://test.local/ns/ops/sa/admin"
# What Istio's sidecar appends: its own identity (By), a hash, the client's verified URI.
SIDECAR = 'By=spiffe://test.local/ns/ai/sa/detection-gateway;Hash=0f1e2d;Subject=""'
XFCC = "x-forwarded-client-cert"
Code = grpc.StatusCode


def appended(client_part: str, caller: str) -> tuple[tuple[str, str], ...]:
    """The header as the gateway gets it: what the client sent, then the sidecar's element."""
    return (
        (
            XFCC,
            f"{client_part},{SIDECAR};URI={caller}" if client_part else f"{SIDECAR};URI={caller}",
        ),
    )


def refused(call: object, *args: object, **kwargs: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        result = call(*args, **kwargs)  # type: ignore[operator]
        if hasattr(result, "__iter__") and not isinstance(result, bytes | str):
            list(result)
    return info.value


def curl(url: str, *args: str) -> tuple[int, dict]:
    binary = tools.binary("curl", tools.CURL_INSTALL)
    done = subprocess.run(
        [binary, "-sS", "--max-time", "60", "-w", "\n%{http_code}", *args, url],
        capture_output=True, text=True, timeout=90, check=True,
    )  # fmt: skip
    body, _, status = done.stdout.rpartition("\n")
    return int(status), json.loads(body or "{}")


def created_by(records: Sequence[dict]) -> list[str]:
    return [r["caller"] for r in records if r.get("message") == "batch job created"]


def test_the_clients_open_quote_cannot_claim_the_sidecars_element(
    tfs: LocalServer, tmp_path: Path
) -> None:
    """The client's own part ends in `URI=<admin>;x="`, an open quote meant to swallow the
    comma before the sidecar's element: the caller is still who the sidecar says."""
    make_images(tmp_path / "data", 2)
    extra = [
        f"--batch-allowed-input-uris={tmp_path / 'data'}",
        "--trust-xfcc=true",
        f"--batch-admins=uri:{ADMIN}",
        "--batch-allow-anonymous=false",
    ]
    forged = f'URI={ADMIN};x="'
    with gateway(tfs, tmp_path / "store", tmp_path, extra, http=True) as gw, gw.channel() as ch:
        attacker = Client(ch, appended(forged, ALICE))
        bob = Client(ch, appended("", BOB))
        bobs = bob.create(input_uri=str(tmp_path / "data")).name
        bob.wait(bobs)
        own = attacker.create(input_uri=str(tmp_path / "data")).name
        attacker.wait(own)
        assert created_by(gw.records()) == [f"uri:{BOB}", f"uri:{ALICE}"]
        # Not the admin: Bob's operation does not exist for the attacker, on either door.
        assert refused(attacker.get, bobs).code() == Code.NOT_FOUND
        listed = attacker.ops.ListOperations(
            lro.ListOperationsRequest(page_size=100), metadata=attacker.metadata
        )
        assert [o.name for o in listed.operations] == [own]
        header = appended(forged, ALICE)[0][1]
        status, body = curl(f"{gw.http_url}/v1/{bobs}", "-H", f"{XFCC}: {header}")
        assert (status, body["error"]["code"]) == (404, "NOT_FOUND")
        status, body = curl(f"{gw.http_url}/v1/operations", "-H", f"{XFCC}: {header}")
        assert status == 200 and [o["name"] for o in body["operations"]] == [own]


def test_a_certificate_is_never_overridden_and_an_over_long_one_is_refused(
    tfs: LocalServer, tmp_path: Path
) -> None:
    """A client certificate whose URI SAN is 1,100 characters: PERMISSION_DENIED naming the
    limit on both doors, also when a (trusted) header names someone else; a certificate
    within it is the caller whatever the header says."""
    long = "spiffe://test.local/" + "a" * 1080
    certs = make_certificates(tmp_path / "certs", clients={"long": long, "alice": ALICE})
    make_images(tmp_path / "data", 1)
    extra = [f"--batch-allowed-input-uris={tmp_path / 'data'}", "--trust-xfcc=true"]
    claims_bob = ((XFCC, f"{SIDECAR};URI={BOB}"),)
    with gateway(tfs, tmp_path / "store", tmp_path, extra, certs, http=True) as gw:
        for headers in ((), claims_bob):
            with channel(gw, certs, "long") as opened:
                error = refused(Client(opened, headers).create, input_uri=str(tmp_path / "data"))
            assert error.code() == Code.PERMISSION_DENIED, error.details()
            assert "1100 characters" in error.details() and "at most 1024" in error.details()
        pair = certs.clients["long"]
        https = gw.http_url.replace("http://", "https://")
        tls = ["--cacert", str(certs.ca), "--cert", str(pair.cert), "--key", str(pair.key)]
        status, body = curl(f"{https}/v1/operations", *tls, "-H", f"{XFCC}: {SIDECAR};URI={BOB}")
        assert status == 403 and body["error"]["code"] == "PERMISSION_DENIED"
        assert "at most 1024" in body["error"]["message"]
        with channel(gw, certs, "alice") as opened:
            alice = Client(opened, claims_bob)
            alice.wait(alice.create(input_uri=str(tmp_path / "data")).name)
        assert created_by(gw.records()) == [f"uri:{ALICE}"]


def test_a_uri_san_and_a_common_name_that_read_the_same_are_two_callers(
    tfs: LocalServer, tmp_path: Path
) -> None:
    """Certificates whose common name is another caller's URI SAN (an admin's included) are
    other callers: identities are typed (uri:..., cn:...)."""
    certs = make_certificates(
        tmp_path / "certs",
        clients={"by-uri": ALICE, "by-cn": "", "admin": ADMIN, "fake-admin": ""},
        common_names={"by-cn": ALICE, "fake-admin": ADMIN},
    )
    make_images(tmp_path / "data", 1)
    extra = [f"--batch-allowed-input-uris={tmp_path / 'data'}", f"--batch-admins=uri:{ADMIN}"]
    with gateway(tfs, tmp_path / "store", tmp_path, extra, certs) as gw:
        with channel(gw, certs, "by-cn") as opened:
            by_cn = Client(opened)
            name = by_cn.create(input_uri=str(tmp_path / "data")).name
            by_cn.wait(name)
        for other in ("by-uri", "fake-admin"):
            with channel(gw, certs, other) as opened:
                error = refused(Client(opened).get, name)
                assert error.code() == Code.NOT_FOUND, other
        with channel(gw, certs, "admin") as opened:
            assert metadata(Client(opened).get(name)).state == bpb.BatchJobMetadata.SUCCEEDED
        assert created_by(gw.records()) == [f"cn:{ALICE}"]


def test_anonymous_callers_are_refused_jobs_saying_how_to_identify(
    tfs: LocalServer, tmp_path: Path
) -> None:
    """No certificate and no trusted header: every jobs call is PERMISSION_DENIED (403 over
    HTTP) with a message saying how to identify, an untrusted header changing nothing."""
    image = make_images(tmp_path / "data", 1)[0]
    extra = [f"--batch-allowed-input-uris={tmp_path / 'data'}", "--batch-allow-anonymous=false"]
    with gateway(tfs, tmp_path / "store", tmp_path, extra, http=True) as gw, gw.channel() as ch:
        upload = bpb.UploadImagesRequest(name="a.jpg", image=image.read_bytes())
        for headers in ((), ((XFCC, f"URI={ALICE}"),)):
            anonymous = Client(ch, headers)
            for error in (
                refused(anonymous.create, input_uri=str(tmp_path / "data")),
                refused(anonymous.batch.UploadImages, iter([upload]), metadata=headers),
                refused(
                    anonymous.ops.ListOperations, lro.ListOperationsRequest(), metadata=headers
                ),
            ):
                assert error.code() == Code.PERMISSION_DENIED, error.details()
                assert "client certificate" in error.details()
                assert "GATEWAY_BATCH_ALLOW_ANONYMOUS" in error.details()
        job = json.dumps({"input_uri": str(tmp_path / "data")})
        for args in (
            ("-H", "Content-Type: application/json", "--data-binary", job),
            ("-F", f"image=@{image}"),
        ):
            path = "/v1/batchJobs" if "-H" in args else "/v1/uploads"
            status, body = curl(f"{gw.http_url}{path}", *args)
            assert status == 403 and body["error"]["code"] == "PERMISSION_DENIED"
            assert "GATEWAY_BATCH_ALLOW_ANONYMOUS" in body["error"]["message"]
        assert not (tmp_path / "store" / "uploads").exists()


@pytest.mark.parametrize("admins", ["anonymous", ALICE, f"uri:{ALICE},anonymous"])
def test_anonymous_or_untyped_admins_stop_the_gateway_at_startup(
    tfs: LocalServer, tmp_path: Path, admins: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "--host=127.0.0.1", "--port=0", "--metrics-port=0",
         f"--upstream={tfs.target}", f"--model-config={MODEL_CONFIG}",
         f"--job-store={tmp_path / 'store'}", f"--batch-admins={admins}"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "GATEWAY_BATCH_ADMINS" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
