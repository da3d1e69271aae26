"""Run-time input shape checks for signatures with fixed dimensions.

TF Serving does not compare a request's shapes with the SignatureDef (serving/local/FACTS.md,
Predict): a wrong shape reaches the graph, which fails in whichever op
first notices, or not at all. Worse, TensorFlow's graph optimizer treats the declared static
shape as true inside the serving function and folds `tf.shape()` into constants, so a
fixed-size model fed another size would silently compute on wrong sizes. `checked_input`
hides the declared shape from the optimizer and asserts the fixed dimensions, so a wrong
shape fails with INVALID_ARGUMENT `assertion failed: [<alias> must have shape ...]` from the
model itself, on the real TF Serving as on the local server.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf


def describe(shape: Sequence[int | None]) -> str:
    """A shape as TF Serving's metadata prints it, -1 for a free dimension: [-1,224,224,3]."""
    return "[" + ",".join("-1" if dim is None else str(dim) for dim in shape) + "]"


def checked_input(tensor: tf.Tensor, alias: str, shape: Sequence[int | None]) -> tf.Tensor:
    """`tensor` with its run-time shape checked against `shape` (None = any size).

    The result has the static shape `shape`, so later ops still know the fixed sizes, but
    it comes from an op the optimizer cannot see through (PlaceholderWithDefault of unknown
    shape), and only after the check has passed.
    """
    hidden = tf.raw_ops.PlaceholderWithDefault(input=tensor, shape=tf.TensorShape(None))
    actual = tf.shape(hidden)
    rank = len(shape)
    # Pad or cut the actual shape to `rank` entries, so the comparison itself cannot fail on
    # a tensor of another rank (-2 never equals a size).
    padded = tf.concat([actual, tf.fill([rank], -2)], axis=0)[:rank]
    matches = tf.equal(tf.size(actual), rank)
    for index, dim in enumerate(shape):
        if dim is not None:
            matches = tf.logical_and(matches, tf.equal(padded[index], dim))
    check = tf.debugging.Assert(
        matches, [f"{alias} must have shape {describe(shape)}; got", actual], summarize=rank + 2
    )
    with tf.control_dependencies([check]):
        result = tf.identity(hidden)
    result.set_shape(shape)
    return result
