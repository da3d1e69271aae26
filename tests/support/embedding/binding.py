"""The embedding task's binding, over messages compiled from its proto.

In the product the proto would sit in proto/ and `make proto` would generate its code into
gateway/proto/; here it is compiled at test time with the same tool (grpc_tools.protoc) and
the same include path, so the tests need no generated code of their own. protoc runs in a
process of its own: run inside the test process, beside the other native libraries loaded
there, its C++ compiler can crash that process (SIGSEGV in protoc.main).
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import google.rpc.status_pb2
import grpc_tools

from gateway.api.bindings import Binding, Trace, served_model, to_model_ref
from gateway.core.domain import Outcome, Request
from tests.support.embedding.task import EMBEDDING, Embedding, EmbedOptions

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PROTO = Path("embedding/v1/embedding.proto")


def compile_messages(out: Path) -> ModuleType:
    """embedding.v1's messages, compiled into `out` and imported (once per process)."""
    if "embedding.v1.embedding_pb2" in sys.modules:
        return sys.modules["embedding.v1.embedding_pb2"]
    googleapis = Path(google.rpc.status_pb2.__file__).resolve().parents[2]
    args = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{HERE / 'proto'}",
        f"-I{ROOT / 'proto'}",
        f"-I{Path(grpc_tools.__file__).parent / '_proto'}",
        f"-I{googleapis}",
        f"--python_out={out}",
        str(PROTO),
    ]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"protoc failed on the embedding proto: {done.stderr.strip()}")
    generated = out / PROTO.with_name("embedding_pb2.py")
    # As proto/generate.py does: the shared messages come from the gateway's package.
    shared = re.compile(r"^from detection\.v1 ", re.MULTILINE)
    generated.write_text(shared.sub("from gateway.proto.detection.v1 ", generated.read_text()))
    for package in (out / "embedding", out / "embedding" / "v1"):
        (package / "__init__.py").touch()
    sys.path.insert(0, str(out))
    return importlib.import_module("embedding.v1.embedding_pb2")


def embedding_binding(messages: ModuleType) -> Binding:
    """The binding: gRPC names, messages, conversions, HTTP verb, OpenAPI texts."""

    def to_request(
        request: object, request_id: str, method: str, timeout: float | None, trace: Trace
    ) -> Request:
        options = EmbedOptions(request.dimensions)  # type: ignore[attr-defined]
        model = to_model_ref(request.model)  # type: ignore[attr-defined]
        image = request.image  # type: ignore[attr-defined]
        return Request(image, model, options, request_id, timeout, method, trace)

    def to_result(outcome: Outcome) -> object:
        assert isinstance(outcome.result, Embedding)
        return messages.EmbeddingResult(
            embedding=outcome.result.vector,
            image_width=outcome.image_width,
            image_height=outcome.image_height,
            model=served_model(outcome),
            request_id=outcome.request_id,
        )

    return Binding(
        task=EMBEDDING,
        verb="embed",
        service=messages.DESCRIPTOR.services_by_name["EmbeddingService"],
        unary="Embed",
        stream="EmbedStream",
        request_type=messages.EmbedRequest,
        result_type=messages.EmbeddingResult,
        to_request=to_request,
        to_result=to_result,
        summary="Embed",
        options={"dimensions": "leading dimensions kept before normalising (0: all)"},
    )
