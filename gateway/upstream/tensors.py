"""TensorProto <-> numpy conversion for the TF Serving hop (no TensorFlow needed).

Inputs are written as `tensor_content` (raw bytes: smaller than `int_val` varints for images and
far faster to build; the request bytes themselves come from gateway.upstream.wire). Outputs are
read from `tensor_content` when TF Serving sends it (`--enable_serialization_as_tensor_content`)
and from the typed field otherwise, following TensorFlow's own rules (tensor.cc FromProto),
through `OutputTensor`: checked when the response arrives, decoded only as far as a task reads
it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gateway.proto.tfswire.v1 import tfserving_pb2 as tfs

# DataType -> (numpy dtype, typed TensorProto field).
_NUMERIC: dict[int, tuple[np.dtype, str]] = {
    tfs.DT_FLOAT: (np.dtype("<f4"), "float_val"),
    tfs.DT_DOUBLE: (np.dtype("<f8"), "double_val"),
    tfs.DT_INT32: (np.dtype("<i4"), "int_val"),
    tfs.DT_UINT8: (np.dtype("u1"), "int_val"),
    tfs.DT_INT16: (np.dtype("<i2"), "int_val"),
    tfs.DT_INT8: (np.dtype("i1"), "int_val"),
    tfs.DT_UINT16: (np.dtype("<u2"), "int_val"),
    tfs.DT_INT64: (np.dtype("<i8"), "int64_val"),
    tfs.DT_UINT32: (np.dtype("<u4"), "uint32_val"),
    tfs.DT_UINT64: (np.dtype("<u8"), "uint64_val"),
    tfs.DT_BOOL: (np.dtype("?"), "bool_val"),
    tfs.DT_HALF: (np.dtype("<f2"), "half_val"),
}


class TensorDecodeError(ValueError):
    """A TensorProto that cannot be turned into an array (bad dtype, size or shape)."""


def dtype_name(dtype: int) -> str:
    """`DT_FLOAT` style name of a DataType number, for error messages."""
    try:
        return tfs.DataType.Name(dtype)  # type: ignore[arg-type]
    except ValueError:
        return f"DataType({dtype})"


def shape_of(proto: tfs.TensorShapeProto) -> tuple[int, ...] | None:
    """Dimensions of a shape (-1 for unknown ones), or None for an unknown rank."""
    if proto.unknown_rank:
        return None
    return tuple(int(dim.size) for dim in proto.dim)


def _shape_proto(shape: Sequence[int]) -> tfs.TensorShapeProto:
    return tfs.TensorShapeProto(dim=[tfs.TensorShapeProto.Dim(size=int(size)) for size in shape])


_IMAGE_DTYPES = {np.dtype(np.uint8): tfs.DT_UINT8, np.dtype(np.float32): tfs.DT_FLOAT}


def image_tensor(pixels: np.ndarray) -> tfs.TensorProto:
    """A [1, H, W, 3] tensor of an RGB image: uint8 (OD API `image_tensor`) or float32
    (`float_image_tensor`), as raw bytes in tensor_content."""
    if pixels.dtype not in _IMAGE_DTYPES or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(
            f"expected a uint8 or float32 [H, W, 3] array, got {pixels.dtype} {pixels.shape}"
        )
    return tfs.TensorProto(
        dtype=_IMAGE_DTYPES[pixels.dtype],
        tensor_shape=_shape_proto((1, *pixels.shape)),
        tensor_content=np.ascontiguousarray(pixels).tobytes(),
    )


def string_tensor(values: Sequence[bytes]) -> tfs.TensorProto:
    """A string [N] tensor (the OD API `encoded_image_string_tensor` input)."""
    return tfs.TensorProto(
        dtype=tfs.DT_STRING,
        tensor_shape=_shape_proto((len(values),)),
        string_val=list(values),
    )


# Typed fields whose values Python numbers hold exactly as TensorFlow means them.
_PLAIN_FIELDS: dict[int, str] = {
    tfs.DT_FLOAT: "float_val",
    tfs.DT_DOUBLE: "double_val",
    tfs.DT_INT32: "int_val",
    tfs.DT_INT64: "int64_val",
}
_STRING = np.dtype(object)


# Layouts read so far, by dtype and serialized shape: a model's outputs have the same few on
# every response, and reading and checking the dims costs several times more than
# serializing them. Each is (numpy dtype, shape, number of values), checked.
_LAYOUTS: dict[tuple[int, bytes], tuple[np.dtype, tuple[int, ...], int]] = {}
_MAX_LAYOUTS = 1024


def _layout(proto: tfs.TensorProto) -> tuple[np.dtype, tuple[int, ...], int]:
    """The dtype, shape and size of a tensor; TensorDecodeError when it cannot be decoded
    whatever its values (unknown rank or dimensions, unsupported dtype)."""
    tensor_shape = proto.tensor_shape
    if tensor_shape.unknown_rank:
        raise TensorDecodeError("tensor has no fully defined shape: None")
    shape = tuple([dim.size for dim in tensor_shape.dim])
    if shape and min(shape) < 0:
        raise TensorDecodeError(f"tensor has no fully defined shape: {shape}")
    number = proto.dtype
    if number == tfs.DT_STRING:
        dtype = _STRING
    else:
        numeric = _NUMERIC.get(number)
        if numeric is None:
            raise TensorDecodeError(f"unsupported tensor dtype {dtype_name(number)}")
        dtype = numeric[0]
    return dtype, shape, math.prod(shape)


class OutputTensor:
    """One output tensor of a PredictResponse, checked at once and decoded when asked.

    The dtype and shape are read, and everything that could make the tensor undecodable is
    checked, when the response arrives (TensorDecodeError); the values are converted only
    when a task asks for them: all of them as an array (`array`), or only the first ones as
    Python numbers (`head`: a detector pads its outputs to 100 rows or more and a handful
    are used, so reading those few is several times cheaper than converting every tensor).
    """

    __slots__ = ("_array", "_proto", "dtype", "shape")

    def __init__(self, proto: tfs.TensorProto) -> None:
        key = (proto.dtype, proto.tensor_shape.SerializeToString())
        layout = _LAYOUTS.get(key)
        if layout is None:
            layout = _layout(proto)
            if len(_LAYOUTS) >= _MAX_LAYOUTS:
                _LAYOUTS.clear()
            _LAYOUTS[key] = layout
        dtype, shape, count = layout
        if dtype is _STRING:
            if len(proto.string_val) != count:
                raise TensorDecodeError(
                    f"string tensor {list(shape)} needs {count} values, got {len(proto.string_val)}"
                )
        else:
            content = proto.tensor_content
            if content and len(content) != count * dtype.itemsize:
                raise TensorDecodeError(
                    f"tensor_content has {len(content)} bytes; {dtype_name(proto.dtype)} "
                    f"{list(shape)} needs {count * dtype.itemsize}"
                )
        self._proto = proto
        self._array: np.ndarray | None = None
        self.dtype = dtype
        self.shape = shape

    def array(self) -> np.ndarray:
        """Every value, as an array of the tensor's shape (made once)."""
        if self._array is None:
            self._array = _decode(self._proto, self.shape)
        return self._array

    def head(self, count: int) -> list[Any]:
        """The first `count` values in row-major order, as Python numbers (TensorFlow's
        rules for typed fields apply, as in `array`); `count` at most the tensor's size."""
        proto = self._proto
        field = _PLAIN_FIELDS.get(proto.dtype)
        if field is not None and not proto.tensor_content and self._array is None:
            values = getattr(proto, field)
            given = len(values)
            if given >= count:
                head: list[Any] = values[:count]
                return head
            if given:
                return [*values, *[values[given - 1]] * (count - given)]
        # Everything else (tensor_content, other dtypes, no values: zeros) through the array.
        flat: list[Any] = self.array().reshape(-1)[:count].tolist()
        return flat


def to_array(proto: tfs.TensorProto) -> np.ndarray:
    """Decodes a TensorProto into an array of its full shape (no per-element Python:
    np.frombuffer for tensor_content, one C-level conversion for the typed field);
    TensorDecodeError when it cannot be decoded."""
    return OutputTensor(proto).array()


def _decode(proto: tfs.TensorProto, shape: tuple[int, ...]) -> np.ndarray:
    """The values of a tensor OutputTensor has checked."""
    dtype_number = proto.dtype
    if dtype_number == tfs.DT_STRING:
        return _string_array(proto, shape)
    dtype, field = _NUMERIC[dtype_number]
    count = math.prod(shape)
    content = proto.tensor_content
    if content:
        return np.frombuffer(content, dtype=dtype).reshape(shape)
    values = getattr(proto, field)
    if dtype_number == tfs.DT_HALF:
        typed = np.asarray(values, dtype=np.uint16).view(np.float16)
    else:
        typed = np.asarray(values, dtype=dtype)
    # TensorFlow's rules: extra values are ignored, missing ones repeat the last value,
    # no values at all means zeros.
    if typed.size == count:
        flat = typed
    elif typed.size > count:
        flat = typed[:count]
    elif typed.size == 0:
        flat = np.zeros(count, dtype=dtype)
    else:
        flat = np.concatenate([typed, np.full(count - typed.size, typed[-1], dtype=dtype)])
    return flat.reshape(shape)


Tensor = np.ndarray | OutputTensor


def as_array(tensor: Tensor) -> np.ndarray:
    """An output (or an array, as tests and other callers pass) as an array."""
    return tensor.array() if isinstance(tensor, OutputTensor) else tensor


def head(tensor: Tensor, count: int) -> list[Any]:
    """The first `count` values of an output (or an array) as Python numbers."""
    if isinstance(tensor, OutputTensor):
        return tensor.head(count)
    flat: list[Any] = tensor.reshape(-1)[:count].tolist()
    return flat


def _string_array(proto: tfs.TensorProto, shape: tuple[int, ...]) -> np.ndarray:
    """A string tensor (of as many values as its shape needs: OutputTensor checks) as an object
    array of bytes (e.g. a classifier's `label` output)."""
    array = np.empty(math.prod(shape), dtype=object)
    array[:] = list(proto.string_val)
    return array.reshape(shape)


def split_batch(
    outputs: Mapping[str, OutputTensor], count: int
) -> list[Mapping[str, Tensor]] | None:
    """Each image's outputs of a batch of `count` (arrays [1, ...], views of the batch's),
    or None when an output does not have the batch as its first dimension."""
    arrays = {}
    for key, tensor in outputs.items():
        if not tensor.shape or tensor.shape[0] != count:
            return None
        arrays[key] = tensor.array()
    return [{key: array[i : i + 1] for key, array in arrays.items()} for i in range(count)]
