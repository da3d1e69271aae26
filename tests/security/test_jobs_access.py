"""Batch jobs safe to share (issue 27 items 1-3), tried as an attacker would, through the real
gRPC door: a gateway process with mTLS and real client certificates (URI SANs as SPIFFE IDs,
and one with a common name only), the local TF Serving behind it.

Rows of the attack table in docs/security.md, each proved by the test named after it:
- input_uri outside the allowed prefixes (`/etc`, `file:///etc/passwd`, a sibling directory,
  `data/../secret`, missing or not): PERMISSION_DENIED, one message for all;
- input_uri `http://169.254.169.254/...`: PERMISSION_DENIED (never fetched);
- a manifest (uploaded, or in an allowed directory) naming `/etc/...`, `file://`, `../`,
  `http://`: each such line PERMISSION_DENIED, existing or missing alike;
- caller B on caller A's operation or upload: NOT_FOUND, as for a name never created;
  ListOperations shows only the caller's own; admins see all;
- x-forwarded-client-cert from a client the gateway does not trust: ignored;
- uploads past the store's bound: RESOURCE_EXHAUSTED, the store stays within it; an upload
  past its images (thousands of tiny multipart parts): RESOURCE_EXHAUSTED at the first one
  over; finished operations and unused uploads expire.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from google.longrunning import operations_pb2 as lro
from PIL import Image

from gateway.jobs.store import JobStore
from gateway.proto.detection.v1 import batch_pb2 as bpb
from tests.support.certs import Certificates, make_certificates
from tests.support.gatewayproc import GatewayProcess
from tests.support.jobs import Client, State, channel, gateway, make_images, metadata
from tests.support.localserver import LocalServer, run_local_server

ALICE = "spiffe://test.local/ns/shop/sa/alice"
BOB = "spiffe://test.local/ns/shop/sa/bob"
ADMIN = "spiffe://test.local/ns/ops/sa/admin"
Code = grpc.StatusCode


@pytest.fixture(scope="module")
def tfs(model_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    args = ["--model_name=detector", f"--model_base_path={model_repo / 'detector'}"]
    log_dir = tmp_path_factory.mktemp("jobs-access-serving")
    with run_local_server(args, log_dir=log_dir) as server:
        yield server


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    names = {"alice": ALICE, "bob": BOB, "admin": ADMIN, "carol": ""}
    return make_certificates(tmp_path_factory.mktemp("jobs-access-certs"), clients=names)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("jobs-access")
    data, secret = root / "data", root / "secret"
    make_images(data / "set", 3)
    make_images(secret, 2)
    (data / "data-twin").mkdir()
    (root / "data-sibling").mkdir()
    make_images(root / "data-sibling", 1)
    (data / "escape").symlink_to(secret)
    return {"root": root, "data": data, "secret": secret}


@contextmanager
def jobs_gateway(
    tfs: LocalServer,
    root: Path,
    extra: Sequence[str],
    certs: Certificates | None = None,
    http: bool = False,
) -> Iterator[GatewayProcess]:
    """A gateway with the jobs API (mTLS when `certs` are given; the HTTP door with `http`),
    its store under `root`."""
    root.mkdir(parents=True, exist_ok=True)
    with gateway(tfs, root / "store", root, extra, certs, http) as gw:
        yield gw


@pytest.fixture(scope="module")
def mtls(tfs: LocalServer, certs: Certificates, dirs: dict[str, Path]) -> Iterator[GatewayProcess]:
    extra = [
        f"--batch-allowed-input-uris={dirs['data']}",
        f"--batch-admins=uri:{ADMIN}",
        "--trust-xfcc=true",  # the certificate still wins over the header
    ]
    with jobs_gateway(tfs, dirs["root"] / "mtls", extra, certs) as gw:
        yield gw


@contextmanager
def client(
    gw: GatewayProcess, certs: Certificates, name: str, headers: Sequence[tuple[str, str]] = ()
) -> Iterator[Client]:
    with channel(gw, certs, name) as opened:
        yield Client(opened, headers)


def refused(call: object, *args: object, **kwargs: object) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        result = call(*args, **kwargs)  # type: ignore[operator]
        if hasattr(result, "__iter__") and not isinstance(result, bytes | str):
            list(result)
    return info.value


def jpeg(seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 24), (seed * 40 % 256, 90, 160)).save(buffer, "JPEG")
    return buffer.getvalue()


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
    with jobs_gateway(tfs, tmp_path, extra) as gw, gw.channel() as channel:
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


# --- bounded storage ----------------------------------------------------------------------


def store_bytes(store: Path) -> int:
    return sum(p.stat().st_size for p in store.rglob("*") if p.is_file())


def test_uploads_past_the_store_bound_are_refused_and_the_store_stays_within_it(
    tfs: LocalServer, dirs: dict[str, Path], tmp_path: Path
) -> None:
    """12 MiB of UploadImages against a store bounded at 4 MiB."""
    limit = 4 * 1024 * 1024
    extra = [f"--job-store-max-bytes={limit}", f"--batch-allowed-input-uris={dirs['data']}"]
    chunk = b"\xff\xd8" + b"x" * (1024 * 1024 - 2)
    with jobs_gateway(tfs, tmp_path, extra) as gw, gw.channel() as channel:
        jobs = Client(channel)
        messages = (bpb.UploadImagesRequest(name=f"i{n:02d}.jpg", image=chunk) for n in range(12))
        error = refused(jobs.batch.UploadImages, messages, timeout=60)
        assert error.code() == Code.RESOURCE_EXHAUSTED
        assert "GATEWAY_JOB_STORE_MAX_BYTES" in error.details()
        assert store_bytes(tmp_path / "store") <= limit
        tally = JobStore(str(tmp_path / "store"), limit).tally  # a job's results fill the
        tally.reserve(left := tally.room())  # store, reserved first: the rest is refused
        (tmp_path / "store" / "jobs" / "earlier").mkdir(parents=True)
        (tmp_path / "store" / "jobs" / "earlier" / "results.jsonl").write_bytes(b"x" * left)
        small = bpb.UploadImagesRequest(name="x.jpg", image=jpeg(1))
        error = refused(jobs.batch.UploadImages, iter([small]), timeout=30)
        assert error.code() == Code.RESOURCE_EXHAUSTED
        error = refused(jobs.create, input_uri=str(dirs["data"] / "set"))
        assert error.code() == Code.RESOURCE_EXHAUSTED
        assert "GATEWAY_JOB_STORE_MAX_BYTES" in error.details()
        assert store_bytes(tmp_path / "store") <= limit  # full: its records reserved 4 KiB


def test_per_caller_upload_limits(tfs: LocalServer, dirs: dict[str, Path], tmp_path: Path) -> None:
    extra = ["--batch-max-uploads-per-caller=2", "--batch-max-upload-bytes-per-caller=100000"]
    with jobs_gateway(tfs, tmp_path, extra) as gw, gw.channel() as channel:
        jobs = Client(channel)
        for n in range(2):
            jobs.batch.UploadImages(iter([bpb.UploadImagesRequest(image=jpeg(n))]), timeout=30)
        error = refused(jobs.batch.UploadImages, iter([bpb.UploadImagesRequest(image=jpeg(3))]))
        assert error.code() == Code.RESOURCE_EXHAUSTED
        assert "GATEWAY_BATCH_MAX_UPLOADS_PER_CALLER" in error.details()
        other = Client(channel, (("x-forwarded-client-cert", "URI=spiffe://x"),))
        big = bpb.UploadImagesRequest(image=b"\xff\xd8" + b"x" * 120000)
        error = refused(other.batch.UploadImages, iter([big]), timeout=30)
        assert error.code() == Code.RESOURCE_EXHAUSTED  # the header is not trusted: anonymous
        assert "GATEWAY_BATCH_MAX_UPLOAD" in error.details()


def test_images_per_upload_are_bounded_on_both_doors(tfs: LocalServer, tmp_path: Path) -> None:
    """Each image is a file in the store, with a cost per image whatever its size: an upload
    holds at most GATEWAY_BATCH_MAX_UPLOAD_IMAGES, appended over gRPC or sent as one
    multipart body of thousands of tiny parts over HTTP (refused at the first part past it)."""
    with (
        jobs_gateway(tfs, tmp_path, ["--batch-max-upload-images=3"], http=True) as gw,
        gw.channel() as channel,
    ):
        jobs = Client(channel)
        images = [bpb.UploadImagesRequest(image=jpeg(n)) for n in range(3)]
        first = jobs.batch.UploadImages(iter(images), timeout=30)
        assert first.image_count == 3
        more = bpb.UploadImagesRequest(upload_id=first.upload_id, image=jpeg(4))
        error = refused(jobs.batch.UploadImages, iter([more]), timeout=30)
        assert error.code() == Code.RESOURCE_EXHAUSTED
        assert f"upload {first.upload_id} holds its limit of 3 images" in error.details()
        assert "GATEWAY_BATCH_MAX_UPLOAD_IMAGES" in error.details()

        boundary = "tiny-images"
        parts = [
            f'--{boundary}\r\nContent-Disposition: form-data; name="image"; '
            f'filename="i{n}.jpg"\r\nContent-Type: image/jpeg\r\n\r\nJFIF\r\n'
            for n in range(2000)
        ]
        body = tmp_path / "tiny.multipart"
        body.write_text("".join(parts) + f"--{boundary}--\r\n")
        answer = subprocess.run(
            [
                "curl", "-sS", "--max-time", "60", "-w", "\n%{http_code}",
                "-H", f"Content-Type: multipart/form-data; boundary={boundary}",
                "--data-binary", f"@{body}", f"{gw.http_url}/v1/uploads",
            ],
            capture_output=True, text=True, timeout=90, check=True,
        )  # fmt: skip
        text, _, status = answer.stdout.rpartition("\n")
        assert status == "429", answer.stdout
        found = json.loads(text)["error"]
        assert found["code"] == "RESOURCE_EXHAUSTED"
        assert "limit of 3 images" in found["message"]


def test_finished_operations_and_unused_uploads_expire(
    tfs: LocalServer, dirs: dict[str, Path], tmp_path: Path
) -> None:
    extra = [
        f"--batch-allowed-input-uris={dirs['data']}",
        "--operation-ttl=1",
        "--upload-ttl=1",
    ]
    with jobs_gateway(tfs, tmp_path, extra) as gw, gw.channel() as channel:
        jobs = Client(channel)
        name = jobs.create(input_uri=str(dirs["data"] / "set")).name
        done = jobs.wait(name)
        area = metadata(done).output_uri
        upload = jobs.batch.UploadImages(iter([bpb.UploadImagesRequest(image=jpeg(5))]))
        expired = {"operation expired", "upload expired"}
        deadline = time.monotonic() + 60
        while {r.get("message") for r in gw.records()} & expired != expired:
            assert time.monotonic() < deadline, "nothing expired within 60 s"
            time.sleep(0.05)
        assert refused(jobs.get, name).code() == Code.NOT_FOUND
        assert not Path(area).exists()  # the results kept in the store went with it
        error = refused(jobs.create, upload_id=upload.upload_id)
        assert error.code() == Code.NOT_FOUND
        assert not list((tmp_path / "store" / "uploads").glob("[!.]*"))  # .lock stays
