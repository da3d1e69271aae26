"""embedding.v1 (EmbeddingService: Embed, EmbedStream) <-> the embedding task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding
from gateway.proto.embedding.v1 import embedding_pb2 as epb
from gateway.tasks.embedding.nouns import Embedding, EmbedOptions

EMBEDDING = "embedding"


def fill_embedding(result: epb.EmbeddingResult, found: Embedding) -> None:
    result.embedding.extend(found.vector)
    result.dimension = len(found.vector)
    result.normalized = found.normalized


BINDING = Binding.of(
    epb.DESCRIPTOR.services_by_name["EmbeddingService"],
    task=EMBEDDING,  # the task's name
    verb="embed",  # POST /v1/models/{model}:embed, --task embed
    options_type=EmbedOptions,  # the options' plain type, made from the message's fields
    fill_result=fill_embedding,  # the result message's own fields from the plain result
    summary="Embed an image (a feature vector for similarity search)",  # OpenAPI
    options={  # each option's help: OpenAPI, --help
        "dimensions": "leading values kept before normalising, for Matryoshka-trained "
        "models (0: all)",
    },
    package=__package__,  # the folder: its page.js, its drawing.py (--draw)
)
