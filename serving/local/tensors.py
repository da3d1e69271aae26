"""TensorProto <-> numpy with the rules of TensorFlow's Tensor::FromProto / AsProto*.

Decoding (requests): the shape must be valid and the dtype set; non-empty tensor_content
must be exactly num_elements x itemsize bytes; otherwise the typed field is read, extras
ignored, the last value repeated to fill, zeros when empty. Encoding (responses): every
element into the typed field (`AsProtoField`), or raw bytes into tensor_content
(`AsProtoTensorContent`). Both are TF Serving's behaviour (serving/local/FACTS.md, tensors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
from tensorflow.core.framework import tensor_shape_pb2, types_pb2
from tensorflow.core.framework.tensor_pb2 import TensorProto

# TensorShape limits (tensor_shape.cc): at most 254 dims, element count must fit int64.
_MAX_DIMS = 254
_MAX_ELEMENTS = 2**63 - 1


@dataclass(frozen=True)
class _Encoding:
    """How one dtype travels: its numpy dtype and the TensorProto field for its values."""

    numpy_dtype: Any
    field: str
    # half and bfloat16 travel in half_val as their 16-bit patterns.
    bits_dtype: Any = None


_ENCODINGS: dict[int, _Encoding] = {
    types_pb2.DT_FLOAT: _Encoding(np.dtype("<f4"), "float_val"),
    types_pb2.DT_DOUBLE: _Encoding(np.dtype("<f8"), "double_val"),
    types_pb2.DT_INT32: _Encoding(np.dtype("<i4"), "int_val"),
    types_pb2.DT_UINT8: _Encoding(np.dtype("u1"), "int_val"),
    types_pb2.DT_INT16: _Encoding(np.dtype("<i2"), "int_val"),
    types_pb2.DT_INT8: _Encoding(np.dtype("i1"), "int_val"),
    types_pb2.DT_UINT16: _Encoding(np.dtype("<u2"), "int_val"),
    types_pb2.DT_INT64: _Encoding(np.dtype("<i8"), "int64_val"),
    types_pb2.DT_UINT32: _Encoding(np.dtype("<u4"), "uint32_val"),
    types_pb2.DT_UINT64: _Encoding(np.dtype("<u8"), "uint64_val"),
    types_pb2.DT_BOOL: _Encoding(np.dtype("?"), "bool_val"),
    types_pb2.DT_HALF: _Encoding(np.dtype("<f2"), "half_val", np.dtype("<u2")),
    types_pb2.DT_BFLOAT16: _Encoding(np.dtype(ml_dtypes.bfloat16), "half_val", np.dtype("<u2")),
    types_pb2.DT_STRING: _Encoding(np.dtype(object), "string_val"),
}
_DTYPE_BY_NUMPY = {
    encoding.numpy_dtype.newbyteorder("="): dtype
    for dtype, encoding in _ENCODINGS.items()
    if dtype != types_pb2.DT_STRING
}


class TensorParseError(ValueError):
    """The TensorProto is not a valid tensor (Tensor::FromProto returned false)."""


def to_numpy(proto: TensorProto) -> np.ndarray:
    """Decodes a request tensor; raises TensorParseError where TensorFlow would refuse it."""
    shape = _valid_shape(proto.tensor_shape)
    encoding = _ENCODINGS.get(proto.dtype)
    if encoding is None:
        raise TensorParseError(f"unsupported dtype {proto.dtype}")
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.empty(shape, dtype=encoding.numpy_dtype)
    if proto.tensor_content:
        flat = _from_content(proto.tensor_content, encoding, count)
    else:
        flat = _from_field(proto, encoding, count)
    return flat.reshape(shape)


def to_proto(array: np.ndarray, dtype: int, as_content: bool) -> TensorProto:
    """Encodes a response tensor like AsProtoField (default) or AsProtoTensorContent."""
    proto = TensorProto(dtype=dtype)
    proto.tensor_shape.CopyFrom(
        tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=size) for size in array.shape]
        )
    )
    encoding = _ENCODINGS[dtype]
    if dtype == types_pb2.DT_STRING:
        values = [_as_bytes(item) for item in array.ravel()]
        if as_content:
            proto.tensor_content = _encode_strings(values)
        else:
            proto.string_val.extend(values)
        return proto
    typed = np.ascontiguousarray(array, dtype=encoding.numpy_dtype)
    if as_content:
        proto.tensor_content = typed.tobytes()
    elif encoding.bits_dtype is not None:
        getattr(proto, encoding.field).extend(typed.view(encoding.bits_dtype).ravel().tolist())
    else:
        getattr(proto, encoding.field).extend(typed.ravel().tolist())
    return proto


def dtype_of(array: np.ndarray) -> int:
    """The DataType enum for a numpy array produced by a TensorFlow session."""
    if array.dtype == object or array.dtype.kind in "SU":
        return types_pb2.DT_STRING
    try:
        return _DTYPE_BY_NUMPY[array.dtype.newbyteorder("=")]
    except KeyError:
        raise TypeError(f"no TensorProto encoding for numpy dtype {array.dtype}") from None


def _valid_shape(shape: tensor_shape_pb2.TensorShapeProto) -> tuple[int, ...]:
    """TensorShape::IsValid: no negative dims, at most 254 dims, no int64 overflow."""
    dims = tuple(int(dim.size) for dim in shape.dim)
    if len(dims) > _MAX_DIMS or any(size < 0 for size in dims):
        raise TensorParseError(f"invalid shape {list(dims)}")
    count = 1
    for size in dims:
        count *= size
        if count > _MAX_ELEMENTS:
            raise TensorParseError(f"shape {list(dims)} has too many elements")
    return dims


def _from_content(content: bytes, encoding: _Encoding, count: int) -> np.ndarray:
    if encoding.field == "string_val":
        return np.array(_decode_strings(content, count), dtype=object)
    expected = count * encoding.numpy_dtype.itemsize
    if len(content) != expected:
        raise TensorParseError(f"tensor_content has {len(content)} bytes, expected {expected}")
    return np.frombuffer(content, dtype=encoding.numpy_dtype)


def _from_field(proto: TensorProto, encoding: _Encoding, count: int) -> np.ndarray:
    values = getattr(proto, encoding.field)
    if encoding.field == "string_val":
        given = np.array(list(values[:count]), dtype=object)
    elif encoding.bits_dtype is not None:
        bits = np.array(values[:count], dtype=np.int64).astype(encoding.bits_dtype)
        given = bits.view(encoding.numpy_dtype)
    else:
        # int_val carries uint8/int8/int16/uint16 as int32; C++ static_cast wraps the same way.
        wide = np.int64 if encoding.numpy_dtype.kind in "iu" else encoding.numpy_dtype
        given = np.array(values[:count], dtype=wide).astype(encoding.numpy_dtype)
    if len(given) == 0:
        zero: object = b"" if encoding.field == "string_val" else 0
        return np.full(count, zero, dtype=encoding.numpy_dtype)
    if len(given) < count:
        padding = np.full(count - len(given), given[-1], dtype=encoding.numpy_dtype)
        given = np.concatenate([given, padding])
    return given


def _as_bytes(item: object) -> bytes:
    return item if isinstance(item, bytes) else str(item).encode()


def _encode_strings(values: list[bytes]) -> bytes:
    """TensorFlow's string tensor_content: all lengths as varints, then all bytes."""
    return b"".join(_varint(len(value)) for value in values) + b"".join(values)


def _decode_strings(content: bytes, count: int) -> list[bytes]:
    lengths = []
    position = 0
    for _ in range(count):
        length, position = _read_varint(content, position)
        lengths.append(length)
    values = []
    for length in lengths:
        if position + length > len(content):
            raise TensorParseError("string tensor_content is truncated")
        values.append(content[position : position + length])
        position += length
    if position != len(content):
        raise TensorParseError("string tensor_content has trailing bytes")
    return values


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(content: bytes, position: int) -> tuple[int, int]:
    value = 0
    for shift in range(0, 35, 7):
        if position >= len(content):
            break
        byte = content[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
    raise TensorParseError("string tensor_content has a bad length prefix")
