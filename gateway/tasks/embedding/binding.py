"""embedding.v1 (EmbeddingService: Embed, EmbedStream) <-> the embedding task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding, page_script, served_model
from gateway.domain import Outcome
from gateway.proto.embedding.v1 import embedding_pb2 as epb
from gateway.tasks.embedding import drawing
from gateway.tasks.embedding.nouns import Embedding, EmbedOptions

EMBEDDING = "embedding"


def to_embedding_result(outcome: Outcome) -> epb.EmbeddingResult:
    result = outcome.result
    assert isinstance(result, Embedding)
    return epb.EmbeddingResult(
        embedding=result.vector,
        dimension=len(result.vector),
        normalized=result.normalized,
        image_width=outcome.image_width,
        image_height=outcome.image_height,
        model=served_model(outcome),
        request_id=outcome.request_id,
    )


BINDING = Binding(
    task=EMBEDDING,
    verb="embed",
    service=epb.DESCRIPTOR.services_by_name["EmbeddingService"],
    unary="Embed",
    stream="EmbedStream",
    request_type=epb.EmbedRequest,
    result_type=epb.EmbeddingResult,
    options_type=EmbedOptions,
    to_result=to_embedding_result,
    summary="Embed an image (a feature vector for similarity search)",
    options={
        "dimensions": "leading values kept before normalising, for Matryoshka-trained "
        "models (0: all)",
    },
    page=page_script(__file__),
    draw=drawing.draw,
)
