"""embedding.v1 (EmbeddingService: Embed, EmbedStream) <-> the embedding task's plain types."""

from __future__ import annotations

from gateway.api.bindings import Binding
from gateway.proto.embedding.v1 import embedding_pb2 as epb
from gateway.tasks.embedding.nouns import Embedding, EmbedOptions


def fill_embedding(result: epb.EmbeddingResult, found: Embedding) -> None:
    result.embedding.extend(found.vector)
    result.dimension = len(found.vector)
    result.normalized = found.normalized


BINDING = Binding.of(
    epb.DESCRIPTOR,  # its service: the RPCs and messages
    EmbedOptions,  # the options' plain type (each field's help: OpenAPI, --help)
    fill_embedding,  # the result message's own fields; its module's folder: page.js, drawing.py
    summary="Embed an image (a feature vector for similarity search)",  # OpenAPI
)
