"""Batch jobs over the API end to end: a real gateway process (local executor), the local
TF Serving, the official google.longrunning Operations stub; each test twice, over plaintext
and over mTLS with a client certificate (the caller is then its identity)."""

from __future__ import annotations

import concurrent.futures
import io
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from google.longrunning import operations_pb2 as lro
from PIL import Image

from gateway.proto.classification.v1 import classification_pb2 as cpb
from gateway.proto.classification.v1 import classification_pb2_grpc as cpb_grpc
from gateway.proto.detection.v1 import detection_pb2 as pb
from gateway.proto.detection.v1 import detection_pb2_grpc as pb_grpc
from gateway.proto.vision.v1 import batch_pb2 as bpb
from gateway.proto.vision.v1 import model_pb2
from tests.support.certs import Certificates, make_certificates
from tests.support.gatewayproc import GatewayProcess
from tests.support.jobs import (
    Client,
    State,
    channel,
    gateway,
    make_images,
    metadata,
    options,
    result,
)

COUNT = 40


@pytest.fixture(scope="module", params=["plaintext", "mtls"])
def certs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Certificates | None:
    if request.param == "plaintext":
        return None
    return make_certificates(tmp_path_factory.mktemp("jobs-flow-certs"))


@pytest.fixture(scope="module")
def dirs(
    tmp_path_factory: pytest.TempPathFactory, certs: Certificates | None, module_store: Path
) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("jobs-flow")
    images = root / "images"
    make_images(images, COUNT)
    (images / "img-00007.jpg").write_bytes(b"not an image")  # one per-image error
    return {"root": root, "images": images, "store": module_store, "allowed": root / "allowed"}


@pytest.fixture(scope="module")
def gw(tfs, dirs, certs) -> Iterator[GatewayProcess]:
    extra = [f"--batch-allowed-uris={dirs['allowed']}", "--batch-max-upload-bytes=200000"]
    with gateway(tfs, dirs["store"], dirs["root"], extra, certs) as process:
        yield process


@pytest.fixture(scope="module")
def client(gw: GatewayProcess, certs: Certificates | None) -> Iterator[Client]:
    with channel(gw, certs) as opened:
        yield Client(opened)


@pytest.fixture(scope="module")
def connect(gw: GatewayProcess, certs: Certificates | None) -> Callable[[], grpc.Channel]:
    return lambda: channel(gw, certs)


def unary_detect(connect: Callable[[], grpc.Channel], data: bytes) -> object:
    with connect() as opened:
        try:
            answer = pb_grpc.DetectionServiceStub(opened).Detect(
                pb.DetectRequest(image=data), timeout=30
            )
        except grpc.RpcError as e:
            return (e.code().value[0], e.details())
    answer.request_id = ""
    return answer


def test_whole_flow_with_the_official_operations_stub(client, connect, dirs) -> None:
    op = client.create(input_uri=str(dirs["images"]), shards=2)
    assert op.name.startswith("operations/") and not op.done
    first = metadata(op)
    assert first.state in (State.QUEUED, State.RUNNING)
    assert first.total == COUNT and first.input_uri == str(dirs["images"])
    assert first.create_time.seconds > 0

    done = client.wait(op.name)
    assert done.HasField("response") and not done.HasField("error")
    meta = metadata(done)
    assert meta.state == State.SUCCEEDED
    assert (meta.total, meta.processed, meta.failed) == (COUNT, COUNT, 1)
    assert [(s.index, s.processed, s.done) for s in meta.shards] == [(0, 20, True), (1, 20, True)]
    assert meta.end_time.ToNanoseconds() >= meta.start_time.ToNanoseconds() > 0
    answer = result(done)
    assert dict(answer.code_counts) == {"OK": COUNT - 1, "INVALID_ARGUMENT": 1}
    assert answer.total == COUNT
    assert list(answer.result_files) == [
        "results-00000-of-00002.jsonl",
        "results-00001-of-00002.jsonl",
    ]
    assert (Path(answer.output_uri) / "_SUCCESS").exists()

    # Every line, in input order, holds what unary Detect gives for the same image.
    lines = client.lines(op.name)
    inputs = sorted(dirs["images"].iterdir())
    assert [line.id for line in lines] == [p.name for p in inputs]
    for line, path in zip(lines, inputs, strict=True):
        expected = unary_detect(connect, path.read_bytes())
        if isinstance(expected, tuple):
            assert not line.HasField("result")
            assert (line.error.code, line.error.message) == expected
            continue
        found = pb.DetectionResult()
        assert line.result.Unpack(found)
        assert found.request_id  # named after its output line by the runner
        found.request_id = ""
        assert found == expected, path.name

    # Resumable by token: after any line, the rest comes again, the same.
    for cut in (0, 19, 20, COUNT - 2):
        rest = client.lines(op.name, lines[cut].page_token)
        assert [(x.file, x.line, x.id) for x in rest] == [
            (x.file, x.line, x.id) for x in lines[cut + 1 :]
        ]
    assert client.lines(op.name, lines[-1].page_token) == []

    listed = client.ops.ListOperations(lro.ListOperationsRequest(filter="state = SUCCEEDED"))
    assert op.name in [o.name for o in listed.operations]
    running = client.ops.ListOperations(lro.ListOperationsRequest(filter="state=RUNNING"))
    assert op.name not in [o.name for o in running.operations]

    # Cancelling a finished operation changes nothing; deleting it forgets it.
    client.ops.CancelOperation(lro.CancelOperationRequest(name=op.name))
    assert metadata(client.get(op.name)).state == State.SUCCEEDED
    client.ops.DeleteOperation(lro.DeleteOperationRequest(name=op.name))
    with pytest.raises(grpc.RpcError) as info:
        client.get(op.name)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert not Path(answer.output_uri).exists()  # the job's own area goes with it


def test_classification_job_from_uploaded_images(client, connect, dirs) -> None:
    images = [p.read_bytes() for p in sorted(dirs["images"].iterdir())[:6] if p.stat().st_size > 20]

    def messages() -> Iterator[bpb.UploadImagesRequest]:
        for index, data in enumerate(images):
            yield bpb.UploadImagesRequest(name=f"u{index}.jpg", image=data)

    upload = client.batch.UploadImages(messages(), timeout=30)
    assert upload.image_count == len(images) and upload.total_bytes == sum(map(len, images))
    more = client.batch.UploadImages(
        iter([bpb.UploadImagesRequest(upload_id=upload.upload_id, name="u9.jpg", image=images[0])])
    )
    assert (more.upload_id, more.image_count) == (upload.upload_id, len(images) + 1)

    op = client.create(
        upload_id=upload.upload_id,
        task="classify",
        model=model_pb2.ModelSpec(name="classifier_scores"),
        options=options(cpb.ClassifyRequest(top_k=3)),
    )
    done = client.wait(op.name)
    assert metadata(done).state == State.SUCCEEDED, done.error
    lines = client.lines(op.name)
    assert [x.id for x in lines] == [*(f"u{i}.jpg" for i in range(len(images))), "u9.jpg"]
    with connect() as opened:
        stub = cpb_grpc.ClassificationServiceStub(opened)
        for line, data in zip(lines, [*images, images[0]], strict=True):
            found = cpb.ClassificationResult()
            assert line.result.Unpack(found)
            model = model_pb2.ModelSpec(name="classifier_scores")
            want = stub.Classify(cpb.ClassifyRequest(image=data, top_k=3, model=model))
            found.request_id = want.request_id = ""
            assert found == want and len(found.classes) == 3


def test_same_request_id_gives_the_same_operation_never_two_jobs(client, dirs) -> None:
    fields = {"input_uri": str(dirs["images"]), "request_id": "5f0c4e2e-idempotent"}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        names = set(pool.map(lambda _: client.create(**fields).name, range(8)))
    assert len(names) == 1
    (name,) = names
    listed = client.ops.ListOperations(lro.ListOperationsRequest(page_size=1000)).operations
    assert sum(o.name == name for o in listed) == 1
    client.wait(name)
    assert client.create(**fields).name == name  # also once it is done
    with pytest.raises(grpc.RpcError) as info:
        client.create(**fields, options=options(pb.DetectRequest(min_score=0.9)))
    assert info.value.code() == grpc.StatusCode.ALREADY_EXISTS


@pytest.mark.parametrize(
    ("fields", "code", "words"),
    [
        ({}, grpc.StatusCode.INVALID_ARGUMENT, "exactly one of input_uri"),
        ({"input_uri": "MISSING"}, grpc.StatusCode.INVALID_ARGUMENT, "does not exist"),
        ({"model": model_pb2.ModelSpec(name="nope")}, grpc.StatusCode.NOT_FOUND, "nope"),
        (
            {"model": model_pb2.ModelSpec(name="classifier_scores")},
            grpc.StatusCode.FAILED_PRECONDITION,
            "classification model",
        ),
        ({"output_uri": "/tmp/elsewhere"}, grpc.StatusCode.PERMISSION_DENIED, "outside"),
        (
            {"options": options(pb.DetectRequest(min_score=1.5))},
            grpc.StatusCode.INVALID_ARGUMENT,
            "min_score must be in [0, 1]",
        ),
        (
            {"options": options(cpb.ClassifyRequest(top_k=3))},
            grpc.StatusCode.INVALID_ARGUMENT,
            "options must be a detection.v1.DetectRequest for task detect",
        ),
        (
            {"options": options(pb.DetectRequest(request_id="r"))},
            grpc.StatusCode.INVALID_ARGUMENT,
            "options sets request_id",
        ),
        ({"task": "transcribe"}, grpc.StatusCode.INVALID_ARGUMENT, "task must be one of detect"),
        ({"request_id": "a\tb"}, grpc.StatusCode.INVALID_ARGUMENT, "control character U+0009"),
        ({"shards": 41}, grpc.StatusCode.INVALID_ARGUMENT, "shards"),
        ({"upload_id": "abc123"}, grpc.StatusCode.NOT_FOUND, "upload abc123"),
    ],
)
def test_bad_jobs_are_refused_at_creation(client, dirs, fields, code, words) -> None:
    if "upload_id" not in fields and "input_uri" not in fields and fields:
        fields = {"input_uri": str(dirs["images"]), **fields}
    if fields.get("input_uri") == "MISSING":  # inside the allowed prefix, but not there
        fields = {"input_uri": str(dirs["root"] / "missing")}
    with pytest.raises(grpc.RpcError) as info:
        client.create(**fields)
    assert info.value.code() == code, info.value.details()
    assert words in info.value.details()


def test_output_inside_an_allowed_prefix_is_accepted(client, dirs) -> None:
    out = dirs["allowed"] / "run-1"
    op = client.wait(client.create(input_uri=str(dirs["images"]), output_uri=str(out)).name)
    assert metadata(op).state == State.SUCCEEDED
    assert (out / "results-00000-of-00001.jsonl").read_text().count("\n") == COUNT


def test_uploads_over_the_limit_or_with_bad_names_are_refused(client) -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "PNG")
    big = bpb.UploadImagesRequest(image=b"x" * 150_000)
    with pytest.raises(grpc.RpcError) as info:
        client.batch.UploadImages(iter([big, big]), timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "200000 bytes" in info.value.details()
    bad = bpb.UploadImagesRequest(name="../x.png", image=buffer.getvalue())
    with pytest.raises(grpc.RpcError) as info:
        client.batch.UploadImages(iter([bad]), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_list_filters_and_pages(client, dirs) -> None:
    for _ in range(3):
        client.wait(client.create(input_uri=str(dirs["images"])).name)
    everything = client.ops.ListOperations(lro.ListOperationsRequest()).operations
    seen: list[str] = []
    token = ""
    while True:
        page = client.ops.ListOperations(lro.ListOperationsRequest(page_size=2, page_token=token))
        assert len(page.operations) <= 2
        seen += [o.name for o in page.operations]
        token = page.next_page_token
        if not token:
            break
    assert seen == [o.name for o in everything] and len(seen) >= 3
    done = client.ops.ListOperations(lro.ListOperationsRequest(filter="done = true"))
    assert {o.name for o in done.operations} == set(seen)
    for bad in ("state=SLEEPING", "owner=me"):
        with pytest.raises(grpc.RpcError) as info:
            client.ops.ListOperations(lro.ListOperationsRequest(filter=bad))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
