"""PredictRequest bytes written around the payload (the hot path of every request).

A 1080p image is 6 MB of pixels. Building a TensorProto, then a PredictRequest, then
serializing it copies those bytes three times into fresh (page-faulting) buffers, which
costs more than decoding the JPEG. Instead the request is serialized here by hand with the
payload last, and the decoder writes the pixels straight into the final request bytes.
Protobuf parsers accept fields in any order, so TF Serving reads exactly the message
`PredictRequest(model_spec, output_filter, inputs={key: tensor})` describes.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Sequence
from functools import lru_cache

from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs

_LENGTH_DELIMITED = 2
_VARINT = 0
_PREDICT_INPUTS = 2  # PredictRequest.inputs (map entries: key = 1, value = 2)
_TENSOR_DTYPE, _TENSOR_SHAPE, _TENSOR_CONTENT, _TENSOR_STRING_VAL = 1, 2, 4, 8
_SHAPE_DIM, _DIM_SIZE = 2, 1


# One-byte varints (tags, dtypes, short keys), made once.
_SMALL_VARINTS = tuple(bytes((value,)) for value in range(0x80))


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


_INPUTS_TAG = _tag(_PREDICT_INPUTS, _LENGTH_DELIMITED)


def _delimited(number: int, payload: bytes) -> bytes:
    return _tag(number, _LENGTH_DELIMITED) + _varint(len(payload)) + payload


def _shape_bytes(shape: Sequence[int]) -> bytes:
    return b"".join(
        _delimited(_SHAPE_DIM, _tag(_DIM_SIZE, _VARINT) + _varint(int(size))) for size in shape
    )


# CPython C API (grpcio exists for CPython only): a bytes object with uninitialised contents
# and a writable view of them. CPython's own C code fills new bytes objects this way before
# anyone else sees them; here the object is only shared (handed to gRPC) once it is complete.
_api = ctypes.pythonapi
_new_bytes = _api.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
_bytes_address = _api.PyBytes_AsString
_bytes_address.restype = ctypes.c_void_p
_bytes_address.argtypes = (ctypes.py_object,)
_memory_view = _api.PyMemoryView_FromMemory
_memory_view.restype = ctypes.py_object
_memory_view.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int)
_PYBUF_WRITE = 0x200

# Large fresh buffers fault in page by page (a 36 MB request: ~9000 faults, more time than
# a third of the decode). Like numpy for its arrays, ask Linux for transparent huge pages on
# buffers of 4 MB and more (best effort: no effect where THP is off or not Linux).
_HUGE_PAGE = 2 * 1024 * 1024
_MADV_HUGEPAGE = 14
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_madvise = getattr(_libc, "madvise", None)
if _madvise is not None:
    _madvise.restype = ctypes.c_int
    _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def _prefer_huge_pages(address: int, size: int) -> None:
    if _madvise is None or size < 2 * _HUGE_PAGE:
        return
    start = -(-address // _HUGE_PAGE) * _HUGE_PAGE
    end = (address + size) // _HUGE_PAGE * _HUGE_PAGE
    if end > start:
        _madvise(start, end - start, _MADV_HUGEPAGE)


class RequestBuffer:
    """A serialized PredictRequest whose tensor payload is written in place.

    `payload` is a writable view of the last bytes of `data`; it does not keep `data` alive,
    so use it only while this object is referenced, and hand `data` on once it is filled.
    """

    __slots__ = ("data", "payload")

    def __init__(self, head: bytes, payload_size: int) -> None:
        size = len(head) + payload_size
        if len(head) < 2:  # sizes 0 and 1 are CPython's shared singletons, never to be written
            raise ValueError("a PredictRequest head is at least 2 bytes")
        self.data: bytes = _new_bytes(None, size)
        address = _bytes_address(self.data)
        _prefer_huge_pages(address, size)
        view: memoryview = _memory_view(address, size, _PYBUF_WRITE)
        view[: len(head)] = head
        self.payload = view[len(head) :]


def _input_entry(envelope: bytes, input_key: str, tensor_head: bytes, payload_size: int) -> bytes:
    """Everything before the payload: envelope, then inputs={key: tensor} up to the payload."""
    key = _delimited(1, input_key.encode())
    tensor_size = len(tensor_head) + payload_size
    entry_head = key + _tag(2, _LENGTH_DELIMITED) + _varint(tensor_size)
    entry_size = len(entry_head) + tensor_size
    return b"".join(
        (envelope, _tag(_PREDICT_INPUTS, _LENGTH_DELIMITED), _varint(entry_size), entry_head,
         tensor_head)
    )  # fmt: skip


def _tensor_head(dtype: int, shape: Sequence[int], payload_field: int, payload_size: int) -> bytes:
    return (
        _tag(_TENSOR_DTYPE, _VARINT)
        + _varint(dtype)
        + _delimited(_TENSOR_SHAPE, _shape_bytes(shape))
        + _tag(payload_field, _LENGTH_DELIMITED)
        + _varint(payload_size)
    )


def predict_request(
    envelope: bytes, input_key: str, dtype: int, shape: Sequence[int], payload_size: int
) -> RequestBuffer:
    """A PredictRequest: `envelope` (a serialized PredictRequest without inputs: model spec
    and output filter) plus inputs={input_key: TensorProto(dtype, shape, tensor_content)};
    the caller writes the `payload_size` bytes of tensor_content into `.payload`."""
    head = _tensor_head(dtype, shape, _TENSOR_CONTENT, payload_size)
    return RequestBuffer(_input_entry(envelope, input_key, head, payload_size), payload_size)


@lru_cache(maxsize=256)
def _string_parts(input_key: str) -> tuple[bytes, bytes]:
    """What every string request for `input_key` has in common: the map entry's key and
    value tag, and the string [1] tensor's dtype, shape and string_val tag."""
    entry_key = _delimited(1, input_key.encode()) + _tag(2, _LENGTH_DELIMITED)
    tensor_fixed = (
        _tag(_TENSOR_DTYPE, _VARINT)
        + _varint(tfs.DT_STRING)
        + _delimited(_TENSOR_SHAPE, _shape_bytes((1,)))
        + _tag(_TENSOR_STRING_VAL, _LENGTH_DELIMITED)
    )
    return entry_key, tensor_fixed


def string_request(envelope: bytes, input_key: str, value: bytes) -> bytes:
    """A PredictRequest with inputs={input_key: string [1] tensor holding `value`}.

    The same bytes as `_input_entry(envelope, input_key, _tensor_head(...)) + value`, with
    the parts that depend only on the key made once (this runs on every string request)."""
    entry_key, tensor_fixed = _string_parts(input_key)
    value_size = _varint(len(value))
    tensor_size = len(tensor_fixed) + len(value_size) + len(value)
    tensor_size_bytes = _varint(tensor_size)
    entry_size = len(entry_key) + len(tensor_size_bytes) + tensor_size
    return b"".join(
        (envelope, _INPUTS_TAG, _varint(entry_size), entry_key, tensor_size_bytes,
         tensor_fixed, value_size, value)
    )  # fmt: skip


def batch_request(
    envelope: bytes,
    input_key: str,
    dtype: int,
    item_shape: Sequence[int],
    parts: Sequence[bytes | memoryview],
) -> bytes:
    """A PredictRequest whose input is the `parts` stacked along a new batch dimension:
    TensorProto(dtype, [len(parts), *item_shape], tensor_content = the parts in order).

    Each part is one image's tensor_content (the tail of its own request, passed as a
    memoryview: no copy until here); they are copied once, straight into the request bytes.
    """
    size = sum(len(part) for part in parts)
    buffer = predict_request(envelope, input_key, dtype, (len(parts), *item_shape), size)
    payload, offset = buffer.payload, 0
    for part in parts:
        end = offset + len(part)
        payload[offset:end] = part
        offset = end
    return buffer.data


_STRING_VAL_TAG = _tag(_TENSOR_STRING_VAL, _LENGTH_DELIMITED)


def string_batch_request(
    envelope: bytes, input_key: str, values: Sequence[bytes | memoryview]
) -> bytes:
    """A PredictRequest with inputs={input_key: string [len(values)] tensor of `values`}."""
    entry_key = _string_parts(input_key)[0]
    head = (
        _tag(_TENSOR_DTYPE, _VARINT)
        + _varint(tfs.DT_STRING)
        + _delimited(_TENSOR_SHAPE, _shape_bytes((len(values),)))
    )
    pieces: list[bytes | memoryview] = [head]
    for value in values:
        pieces += (_STRING_VAL_TAG, _varint(len(value)), value)
    tensor = b"".join(pieces)
    tensor_size = _varint(len(tensor))
    entry_size = len(entry_key) + len(tensor_size) + len(tensor)
    return b"".join((envelope, _INPUTS_TAG, _varint(entry_size), entry_key, tensor_size, tensor))
