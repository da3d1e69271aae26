"""pipeline.v1.PipelineService over the cascades (gateway.core.cascade): the same unary and
streaming calls as the tasks' services (gateway.frontends.grpc.servicers), converted by
gateway.api.pipelines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, NamedTuple

import grpc

from gateway.api import pipelines
from gateway.api.bindings import Bindings
from gateway.config import Settings
from gateway.core.cascade import Cascades
from gateway.domain import Outcome, Request
from gateway.errors import GatewayError
from gateway.frontends.grpc.servicers import Drain, serve_stream, serve_unary, to_status
from gateway.proto.pipeline.v1 import pipeline_pb2 as ppb


class _Named(NamedTuple):
    """The cascades as a Runner: the pipeline a request names (its model.name)."""

    settings: Settings
    cascades: Cascades

    async def run(self, name: str, request: Request) -> Outcome:
        return await self.cascades.run_named(request)


class PipelineServicer:
    """pipeline.v1.PipelineService (gateway.api.pipelines) over the cascades."""

    def __init__(self, cascades: Cascades, results: pipelines.Results, drain: Drain) -> None:
        self._runner = _Named(cascades.settings, cascades)
        self._results = results
        self._drain = drain

    async def unary(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await serve_unary(
            self._runner, self._drain, "", "Run", request, context, pipelines.to_request,
            self._results.to_result, pipelines.check,
        )  # fmt: skip

    async def stream(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        async for result in serve_stream(
            self._runner, self._drain, "", "RunStream", request_iterator, context,
            pipelines.to_request, self._results.to_result, self._error_result, pipelines.check,
        ):  # fmt: skip
            yield result

    @staticmethod
    def _error_result(error: GatewayError, request_id: str) -> Any:
        return ppb.PipelineResult(request_id=request_id, error=to_status(error))


def add_pipeline_service(
    server: grpc.aio.Server, cascades: Cascades, bindings: Bindings, drain: Drain
) -> str:
    """Adds pipeline.v1.PipelineService; returns its full name."""
    servicer = PipelineServicer(cascades, pipelines.Results(bindings), drain)
    parse, serialize = ppb.RunRequest.FromString, ppb.PipelineResult.SerializeToString
    handlers = {
        "Run": grpc.unary_unary_rpc_method_handler(
            servicer.unary, request_deserializer=parse, response_serializer=serialize
        ),
        "RunStream": grpc.stream_stream_rpc_method_handler(
            servicer.stream, request_deserializer=parse, response_serializer=serialize
        ),
    }
    name = str(pipelines.SERVICE.full_name)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
    server.add_registered_method_handlers(name, handlers)
    return name
