"""Batch jobs safe to share (issue 27 items 1-3), tried as an attacker would, through the real
gRPC door: a gateway process with mTLS and real client certificates (URI SANs as SPIFFE IDs,
and one with a common name only), the local TF Serving behind it (tests/security/conftest.py).

Rows of the attack table in docs/security.md, each proved by the test named after it:
- input_uri outside the allowed prefixes (`/etc`, `file:///etc/passwd`, a sibling directory,
  `data/../secret`, missing or not): PERMISSION_DENIED, one message for all;
- input_uri `http://169.254.169.254/...`: PERMISSION_DENIED (never fetched);
- a manifest (uploaded, or in an allowed directory) naming `/etc/...`, `file://`, `../`,
  `http://`: each such line PERMISSION_DENIED, existing or missing alike;
- caller B on caller A's operation or upload: NOT_FOUND, as for a name never created;
  ListOperations shows only the caller's own; admins see all;
- x-forwarded-client-cert from a client the gateway does not trust: ignored.
The bounds on what jobs may store are in test_jobs_storage.py.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from google.longrunning import operations_pb2 as lro

from gateway.proto.vision.v1 import batch_pb2 as bpb
from tests.support.certs import Certificates, make_certificates
from tests.support.gatewayproc import GatewayProcess
from tests.support.jobs import Client, State, channel, gateway_under, jpeg, metadata, refused
from tests.support.localserver import LocalServer

ALICE = "spiffe://test.local/ns/shop/sa/alice"
BOB = "spiffe://test.local/ns/shop/sa/bob"
ADMIN = "spiffe://test.local/ns/ops/sa/admin"
Code = grpc.StatusCode


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    names = {"alice": ALICE, "bob": BOB, "admin": ADMIN, "carol": ""}
    return make_certificates(tmp_path_factory.mktemp("jobs-access-certs"), clients=names)


@pytest.fixture(scope="module")
def mtls(tfs: LocalServer, certs: Certificates, dirs: dict[str, Path]) -> Iterator[GatewayProcess]:
    extra = [
        f"--batch-allowed-input-uris={dirs['data']}",
        f"--batch-admins=uri:{ADMIN}",
        "--trust-xfcc=true",  # the certificate still wins over the header
    ]
    with gateway_under(tfs, dirs["root"] / "mtls", extra, certs) as gw:
        yield gw


@contextmanager
def client(
    gw: GatewayProcess, certs: Certificates, name: str, headers: Sequence[tuple[str, str]] = ()
) -> Iterator[Client]:
    with channel(gw, certs, name) as opened:
        yield Client(opened, headers)


# --- inputs a job may read ---------------------------------------------------------------


def test_inputs_outside_the_allowed_prefixes_are_denied_whether_or_not_they_exist(
    mtls: GatewayProcess, certs: Certificates, dirs: dict[str, Path]
) -> None:
    data, root = dirs["data"], dirs["root"]
    attempts = [
        "/etc",
        "file:///etc/passwd",
        "/etc/no-such-file",
        str(root / "data-sibling"),  # shares the prefix's leading characters
        f"{data}/../secret",
        f"{data}/../no-such-dir",
        f"{data}//..//secret",
        str(data / "escape"),  # a symlink inside the prefix that leads out of it
        str(data / "escape" / "img-00000.jpg"),
        "data/../secret",  # relative: to the gateway's working directory, not data/
    ]
    with client(mtls, certs, "alice") as alice:
        messages = set()
        for url in attempts:
            error = refused(alice.create, input_uri=url)
            assert error.code() == Code.PERMISSION_DENIED, (url, error.details())
            messages.add(error.details().replace(url, "<input>"))
        assert len(messages) == 1, messages  # nothing tells what exists
        (message,) = messages
        assert "GATEWAY_BATCH_ALLOWED_INPUT_URIS" in message
        ok = alice.wait(alice.create(input_uri=str(data / "set")).name)
        assert metadata(ok).state == State.SUCCEEDED


def test_the_metadata_endpoint_is_denied_not_fetched(
    mtls: GatewayProcess, certs: Certificates
) -> None:
    with client(mtls, certs, "alice") as alice:
        for url in (
            "http://169.254.169.254/latest/meta-data/",
            "https://169.254.169.254/latest/meta-data/iam/",
            "simplecache::http://169.254.169.254/latest/",
        ):
            error = refused(alice.create, input_uri=url)
            assert error.code() == Code.PERMISSION_DENIED, (url, error.details())


def test_manifest_lines_outside_are_line_errors_existing_or_missing_alike(
    mtls: GatewayProcess, certs: Certificates, dirs: dict[str, Path]
) -> None:
    data, secret = dirs["data"], dirs["secret"]
    lines = [
        {"image": "set/img-00000.jpg"},  # inside the manifest's directory: read
        {"image": "/etc/passwd"},
        {"image": "/etc/no-such-file"},
        {"image": f"file://{secret}/img-00000.jpg"},
        {"image": f"file://{secret}/no-such.jpg"},
        {"image": "../secret/img-00001.jpg"},
        {"image": "../secret/no-such.jpg"},
        {"image": "escape/img-00000.jpg"},  # through the symlink
        {"image": "http://169.254.169.254/latest/meta-data/"},
        {"image": "set/no-such.jpg"},  # inside and missing: NOT_FOUND, as before
    ]
    manifest = data / "list.jsonl"
    manifest.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with client(mtls, certs, "alice") as alice:
        op = alice.create(input_uri=str(manifest))
        got = alice.lines(alice.wait(op.name).name)
    assert [x.HasField("result") for x in got] == [True] + [False] * 9
    denied = [x for x in got[1:9]]
    assert {x.error.code for x in denied} == {Code.PERMISSION_DENIED.value[0]}
    shapes = {
        x.error.message.replace(str(lines[i + 1]["image"]), "<image>").replace(
            f"line {i + 2}:", "line N:"
        )
        for i, x in enumerate(denied)
    }
    assert len(shapes) == 1, shapes  # the same words whether the file exists or not
    assert got[9].error.code == Code.NOT_FOUND.value[0]

    # The same manifest uploaded: only its own upload (and the allowed prefix) may be named.
    uploaded = [
        {"image_bytes": base64.b64encode(jpeg(1)).decode()},
        {"image": "../../uploads"},
        {"image": f"{secret}/img-00000.jpg"},
        {"image": f"{data}/set/img-00001.jpg"},  # an allowed prefix: read
    ]
    body = "".join(json.dumps(line) + "\n" for line in uploaded).encode()
    with client(mtls, certs, "alice") as alice:
        upload = alice.batch.UploadImages(
            iter([bpb.UploadImagesRequest(name="list.jsonl", image=body)]), timeout=30
        )
        op = alice.create(upload_id=upload.upload_id)
        got = alice.lines(alice.wait(op.name).name)
    assert [x.HasField("result") for x in got] == [True, False, False, True]
    assert {got[1].error.code, got[2].error.code} == {Code.PERMISSION_DENIED.value[0]}


# --- operations belong to their caller ----------------------------------------------------


def test_other_callers_operations_and_uploads_do_not_exist(
    mtls: GatewayProcess, certs: Certificates, dirs: dict[str, Path]
) -> None:
    images = str(dirs["data"] / "set")
    claims_bob = (("x-forwarded-client-cert", f"URI={BOB}"),)
    with (
        client(mtls, certs, "alice") as alice,
        client(mtls, certs, "alice", claims_bob) as alice_claiming_bob,
        client(mtls, certs, "bob") as bob,
        client(mtls, certs, "admin") as admin,
        client(mtls, certs, "carol") as carol,
    ):
        # Alice's job, made while she names Bob in the header (the gateway trusts the header
        # of callers without a certificate): her certificate is who she is.
        name = alice_claiming_bob.create(input_uri=images).name
        alice.wait(name)
        upload = alice.batch.UploadImages(
            iter([bpb.UploadImagesRequest(name="a.jpg", image=jpeg(2))]), timeout=30
        )
        never = "operations/" + "0" * 24

        def same_as_never(error: grpc.RpcError) -> None:
            assert error.code() == Code.NOT_FOUND, error.details()
            assert error.details().replace(name, never) == f"no operation named {never!r}"

        same_as_never(refused(bob.get, name))
        same_as_never(refused(bob.ops.WaitOperation, lro.WaitOperationRequest(name=name)))
        same_as_never(refused(bob.ops.CancelOperation, lro.CancelOperationRequest(name=name)))
        same_as_never(refused(bob.ops.DeleteOperation, lro.DeleteOperationRequest(name=name)))
        same_as_never(refused(bob.lines, name))
        assert refused(bob.get, never).details() == f"no operation named {never!r}"
        listed = bob.ops.ListOperations(lro.ListOperationsRequest(page_size=1000)).operations
        assert name not in [o.name for o in listed]

        # Alice's upload: not there for Bob, neither to add to nor to run a job over.
        append = bpb.UploadImagesRequest(upload_id=upload.upload_id, name="b.jpg", image=jpeg(3))
        error = refused(bob.batch.UploadImages, iter([append]), timeout=30)
        assert error.code() == Code.NOT_FOUND
        missing = bpb.UploadImagesRequest(upload_id="f" * 24, name="b.jpg", image=jpeg(3))
        unknown = refused(bob.batch.UploadImages, iter([missing]), timeout=30)
        assert error.details().replace(upload.upload_id, "f" * 24) == unknown.details()
        error = refused(bob.create, upload_id=upload.upload_id)
        assert error.code() == Code.NOT_FOUND

        # Alice still has everything; the admin sees and manages it; Carol (a certificate
        # with a common name only) is a caller of her own.
        assert metadata(alice.get(name)).state == State.SUCCEEDED
        assert len(alice.lines(name)) == 3
        own = alice.ops.ListOperations(lro.ListOperationsRequest()).operations
        assert name in [o.name for o in own]
        assert metadata(admin.get(name)).state == State.SUCCEEDED
        everything = admin.ops.ListOperations(lro.ListOperationsRequest(page_size=1000))
        assert name in [o.name for o in everything.operations]
        carols = carol.create(input_uri=images).name
        carol.wait(carols)
        same_as_carol = refused(alice.get, carols)
        assert same_as_carol.code() == Code.NOT_FOUND
        admin.ops.DeleteOperation(lro.DeleteOperationRequest(name=carols))
        assert refused(carol.get, carols).code() == Code.NOT_FOUND


@pytest.mark.parametrize("trust", [False, True], ids=["untrusted", "trusted"])
def test_xfcc_is_an_identity_only_when_the_gateway_trusts_it(
    trust: bool, tfs: LocalServer, dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A plaintext client naming someone else in x-forwarded-client-cert: ignored (the
    operation is the anonymous caller's), unless --trust-xfcc (a proxy that overwrites the
    header sits in front)."""
    extra = [f"--batch-allowed-input-uris={dirs['data']}", f"--trust-xfcc={str(trust).lower()}"]
    header = (("x-forwarded-client-cert", f'By=spiffe://gw;URI="{ALICE}"'),)
    with gateway_under(tfs, tmp_path, extra) as gw, gw.channel() as channel:
        claiming, anonymous = Client(channel, header), Client(channel)
        name = claiming.create(input_uri=str(dirs["data"] / "set")).name
        claiming.wait(name)
        if trust:
            assert refused(anonymous.get, name).code() == Code.NOT_FOUND
        else:
            assert metadata(anonymous.get(name)).state == State.SUCCEEDED
            listed = anonymous.ops.ListOperations(lro.ListOperationsRequest()).operations
            assert [o.name for o in listed] == [name]
        created = [r for r in gw.records() if r.get("message") == "batch job created"]
        assert [r["caller"] for r in created] == [f"uri:{ALICE}" if trust else "anonymous"]
