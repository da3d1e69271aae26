"""A signature that cannot parse its input answers INVALID_ARGUMENT, like TF Serving, and
neither the message nor the server's log carries more than a short escaped prefix of the
binary value it quotes (serving/local/FACTS.md, `unparsable_example`).

The model takes a serialized tf.train.Example (a `tf_example` export's input) and is sent a
bare JPEG, the mistake a client makes when it does not wrap the image.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import tensorflow as tf
from PIL import Image
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from serving.local.errors import BINARY_PREFIX_BYTES, readable
from tests.support.facts import fact
from tests.support.localserver import LocalServer, run_local_server

MODEL = "example_parser"


class _ExampleParser(tf.Module):
    """Mean pixel of the `image/encoded` image of each serialized Example."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="input_tensor")])
    def __call__(self, input_tensor: tf.Tensor) -> dict[str, tf.Tensor]:
        features = tf.io.parse_example(
            input_tensor, {"image/encoded": tf.io.FixedLenFeature([], tf.string)}
        )

        def mean(encoded: tf.Tensor) -> tf.Tensor:
            image = tf.io.decode_image(encoded, channels=3, expand_animations=False)
            return tf.reduce_mean(tf.cast(image, tf.float32))

        return {"mean": tf.map_fn(mean, features["image/encoded"], fn_output_signature=tf.float32)}


def _jpeg() -> bytes:
    rng = np.random.default_rng(5)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(buffer, "JPEG")
    return buffer.getvalue()


def _example(image: bytes) -> bytes:
    feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=[image]))
    example = tf.train.Example(features=tf.train.Features(feature={"image/encoded": feature}))
    return example.SerializeToString()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServer]:
    directory = tmp_path_factory.mktemp("unparsable")
    module = _ExampleParser()
    tf.saved_model.save(
        module, str(directory / MODEL / "1"), signatures={"serving_default": module.__call__}
    )
    args = [f"--model_name={MODEL}", f"--model_base_path={directory / MODEL}"]
    with run_local_server(args, log_dir=directory) as tfs:
        yield tfs


def _predict(server: LocalServer, value: bytes) -> predict_pb2.PredictResponse:
    request = predict_pb2.PredictRequest()
    request.model_spec.name = MODEL
    request.inputs["input_tensor"].CopyFrom(tf.make_tensor_proto([value]))
    with server.channel() as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        return stub.Predict(request, timeout=60)


def test_a_wrapped_image_is_parsed(server: LocalServer) -> None:
    response = _predict(server, _example(_jpeg()))
    assert 100 < tf.make_ndarray(response.outputs["mean"])[0] < 155


def test_bare_image_bytes_are_invalid_argument_with_a_short_escaped_prefix(
    server: LocalServer,
) -> None:
    image = _jpeg()
    with pytest.raises(grpc.RpcError) as caught:
        _predict(server, image)
    code, text = fact("unparsable_example", serialized_value="")
    prefix = text[: text.index("'") + 1]
    assert caught.value.code().name == code
    message = caught.value.details()
    assert message.startswith(prefix + "\\xff\\xd8\\xff"), message
    assert message.isprintable()
    assert len(message) <= len(prefix) + 4 * BINARY_PREFIX_BYTES + len("...")
    log = server.log_path.read_bytes()
    assert image[:4] not in log and image[-64:] not in log
    log.decode("utf-8")  # no raw binary in the log


def test_readable_keeps_text_and_cuts_binary_values() -> None:
    assert readable("plain text\n\t [[{{node x}}]]") == "plain text\n\t [[{{node x}}]]"
    assert readable(b"value: '\xff\xd8\xff\xe0") == "value: '\\xff\\xd8\\xff\\xe0"
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(40))
    shown = readable(b"value: '" + png + b"'")
    assert shown == "value: '" + repr(png[:BINARY_PREFIX_BYTES])[2:-1] + "..."
    assert readable("tab\tthen\x00nul") == "tab\tthen\\x00nul"
