"""TF Serving config messages that the tensorflow-serving-api wheel does not ship.

The wheel has `tensorflow_serving.config.model_server_config_pb2` but not
`session_bundle_config_pb2` (BatchingParameters) or `monitoring_config_pb2`. Both are
rebuilt here from their .proto definitions (tensorflow/serving at 9d981c5: same package,
message names, field names and numbers), in a private descriptor pool so they can never
clash with an installed copy of the real modules. text_format parses them exactly as
TF Serving's ParseProtoTextFile would.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, wrappers_pb2
from google.protobuf.message import Message

_F = descriptor_pb2.FieldDescriptorProto
_POOL = descriptor_pool.DescriptorPool()
_POOL.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)

# (name, number, type, label, message type) per field, in .proto order.
_BATCHING_FIELDS = (
    ("max_batch_size", 1, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".google.protobuf.Int64Value"),
    ("batch_timeout_micros", 2, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".google.protobuf.Int64Value"),
    ("max_enqueued_batches", 3, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".google.protobuf.Int64Value"),
    ("num_batch_threads", 4, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".google.protobuf.Int64Value"),
    ("thread_pool_name", 5, _F.TYPE_MESSAGE, _F.LABEL_OPTIONAL, ".google.protobuf.StringValue"),
    (
        "enable_large_batch_splitting",
        8,
        _F.TYPE_MESSAGE,
        _F.LABEL_OPTIONAL,
        ".google.protobuf.BoolValue",
    ),
    (
        "max_execution_batch_size",
        9,
        _F.TYPE_MESSAGE,
        _F.LABEL_OPTIONAL,
        ".google.protobuf.Int64Value",
    ),
    ("allowed_batch_sizes", 6, _F.TYPE_INT64, _F.LABEL_REPEATED, ""),
    ("pad_variable_length_inputs", 7, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, ""),
)
_PROMETHEUS_FIELDS = (
    ("enable", 1, _F.TYPE_BOOL, _F.LABEL_OPTIONAL, ""),
    ("path", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL, ""),
)
_MONITORING_FIELDS = (
    (
        "prometheus_config",
        1,
        _F.TYPE_MESSAGE,
        _F.LABEL_OPTIONAL,
        ".tensorflow.serving.PrometheusConfig",
    ),
)


def _add_file(
    name: str,
    dependencies: list[str],
    messages: dict[str, tuple[tuple[str, int, int, int, str], ...]],
) -> None:
    proto = descriptor_pb2.FileDescriptorProto(
        name=name, package="tensorflow.serving", syntax="proto3", dependency=dependencies
    )
    for message_name, message_fields in messages.items():
        message = proto.message_type.add(name=message_name)
        for field_name, number, field_type, label, type_name in message_fields:
            added = message.field.add(name=field_name, number=number, type=field_type, label=label)
            if type_name:
                added.type_name = type_name
    _POOL.Add(proto)


_add_file(
    "tensorflow_serving/servables/tensorflow/session_bundle_config.proto",
    ["google/protobuf/wrappers.proto"],
    {"BatchingParameters": _BATCHING_FIELDS},
)
_add_file(
    "tensorflow_serving/config/monitoring_config.proto",
    [],
    {"PrometheusConfig": _PROMETHEUS_FIELDS, "MonitoringConfig": _MONITORING_FIELDS},
)

BatchingParameters: type[Message] = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName("tensorflow.serving.BatchingParameters")
)
MonitoringConfig: type[Message] = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName("tensorflow.serving.MonitoringConfig")
)
