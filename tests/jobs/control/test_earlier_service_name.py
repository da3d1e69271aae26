"""The jobs API under its earlier name, detection.v1.BatchService, with that name's own
stubs and messages (and the first release's detection.v1.ModelSpec): served until the next
release, each operation packing its metadata and response under the names of the API that
created it (CHANGELOG.md, "Moving to vision.v1")."""

from __future__ import annotations

from google.longrunning import operations_pb2 as lro
from google.longrunning import operations_pb2_grpc as lro_grpc

from gateway.proto.detection.v1 import batch_pb2 as earlier
from gateway.proto.detection.v1 import batch_pb2_grpc as earlier_grpc
from gateway.proto.detection.v1 import detection_pb2
from gateway.proto.vision.v1 import batch_pb2 as bpb
from gateway.proto.vision.v1 import model_pb2
from tests.support.jobs import Client, gateway, make_images

URL = "type.googleapis.com/"


def test_the_earlier_names_stubs_run_a_job_and_see_their_own_types(tfs, tmp_path, store) -> None:
    images = make_images(tmp_path / "images", 3)
    dataset = str(tmp_path / "images")
    with gateway(tfs, store, tmp_path) as gw, gw.channel() as channel:
        old = earlier_grpc.BatchServiceStub(channel)
        request = earlier.CreateBatchJobRequest(
            input_uri=dataset,
            model=detection_pb2.ModelSpec(name="detector"),  # the first release's ModelSpec
            task="detect",
            request_id="earlier-name-1",
        )
        op = old.CreateBatchJob(request, timeout=30)
        assert op.metadata.type_url == URL + "detection.v1.BatchJobMetadata"
        metadata = earlier.BatchJobMetadata()
        assert op.metadata.Unpack(metadata) and metadata.input_uri == dataset

        client = Client(channel)  # vision.v1's stubs; Operations is the same service
        done = client.wait(op.name)
        result = earlier.BatchJobResult()
        assert done.response.Unpack(result), done.response.type_url
        assert dict(result.code_counts) == {"OK": 3}

        read = earlier.ReadBatchResultsRequest(name=op.name)
        lines = list(old.ReadBatchResults(read, timeout=60))
        assert [line.id for line in lines] == [p.name for p in images]
        found = detection_pb2.DetectionResult()
        assert lines[0].result.Unpack(found) and found.model.name == "detector"

        # The same request through the new name is a retry of the same job, still shown as
        # its creator asked; a job created through vision.v1 shows vision.v1's names.
        again = client.create(
            input_uri=dataset,
            model=model_pb2.ModelSpec(name="detector"),
            task="detect",
            request_id="earlier-name-1",
        )
        assert again.name == op.name
        assert again.metadata.type_url == URL + "detection.v1.BatchJobMetadata"
        new = client.create(input_uri=dataset, task="detect")
        assert new.metadata.type_url == URL + "vision.v1.BatchJobMetadata"
        assert client.wait(new.name).response.Is(bpb.BatchJobResult.DESCRIPTOR)

        listed = lro_grpc.OperationsStub(channel).ListOperations(
            lro.ListOperationsRequest(), timeout=10
        )
        assert {o.name: o.metadata.type_url for o in listed.operations} == {
            op.name: URL + "detection.v1.BatchJobMetadata",
            new.name: URL + "vision.v1.BatchJobMetadata",
        }
