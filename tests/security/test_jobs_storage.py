"""Batch jobs cannot fill the gateway's store (issue 27), tried through the real doors of a
gateway process per test, the local TF Serving behind it (tests/security/conftest.py).

Rows of the attack table in docs/security.md, each proved by the test named after it:
- uploads past the store's bound: RESOURCE_EXHAUSTED, the store stays within it;
- one caller opening many uploads or sending many bytes: RESOURCE_EXHAUSTED;
- an upload past its images (thousands of tiny multipart parts): RESOURCE_EXHAUSTED at the
  first one over;
- finished operations and unused uploads expire.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import grpc

from gateway.jobs.control.store import JobStore
from gateway.proto.vision.v1 import batch_pb2 as bpb
from tests.support.jobs import Client, gateway_under, jpeg, metadata, refused
from tests.support.localserver import LocalServer

Code = grpc.StatusCode


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
    with gateway_under(tfs, tmp_path, extra) as gw, gw.channel() as channel:
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
    with gateway_under(tfs, tmp_path, extra) as gw, gw.channel() as channel:
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
        gateway_under(tfs, tmp_path, ["--batch-max-upload-images=3"], http=True) as gw,
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
    with gateway_under(tfs, tmp_path, extra) as gw, gw.channel() as channel:
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
