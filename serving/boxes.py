"""Steps 3 to 5 of serving.detector on candidate boxes: the run of mask pixels through a
seed, edge refinement by a vote of the mask and by colour, and the boxes' scores, from
integral images and per-line prefix sums."""

from __future__ import annotations

import tensorflow as tf

# Closeness is summed in int32 fixed point (exact, unlike float32 sums over millions of
# pixels); 32 steps per pixel allow images of up to 2**31 / 32 = 67 megapixels.
CLOSENESS_SCALE = 32


def run_extent(lines: tf.Tensor, pos: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """For each row of `lines` [S, N] (bool), the run of True values containing index `pos`.

    Returns (start, end, inside): the run is [start, end); `inside` is False when lines[pos]
    itself is False, in which case start/end are meaningless.
    """
    # zeros[i] = number of False values in lines[0..i]; it is non-decreasing, so the borders
    # of the run around pos are found by binary search.
    zeros = tf.cumsum(tf.cast(tf.logical_not(lines), tf.int32), axis=1)
    count = tf.gather(zeros, pos, batch_dims=1)[:, tf.newaxis]
    # First False after pos: first index where the count reaches count + 1 (N if none).
    end = tf.searchsorted(zeros, count + 1, side="left")[:, 0]
    # Last False before pos: the first index where the count reaches `count`, if count > 0.
    last_zero = tf.searchsorted(zeros, count, side="left")[:, 0]
    start = tf.where(count[:, 0] > 0, last_zero + 1, 0)
    inside = tf.gather(lines, pos, batch_dims=1)
    return start, end, inside


def integral_images(channels: tf.Tensor) -> tf.Tensor:
    """Integral images [H+1, W+1, C] of int32 channels [H, W, C] (exact, unlike float32).

    The cumulative sums are the costliest step for large images (~0.2 s at 2000x2000).
    """
    return tf.pad(tf.cumsum(tf.cumsum(channels, axis=0), axis=1), [[1, 0], [1, 0], [0, 0]])


def region_mean(
    integral: tf.Tensor,
    channel: tf.Tensor,
    y0: tf.Tensor,
    x0: tf.Tensor,
    y1: tf.Tensor,
    x1: tf.Tensor,
) -> tf.Tensor:
    """Mean of `channel` [S] over pixel regions [y0, y1) x [x0, x1) [S]; 0 for empty regions.

    Coordinates are clipped to the image first, so strips beyond a border are empty.
    """
    height = tf.shape(integral)[0] - 1
    width = tf.shape(integral)[1] - 1
    y0, y1 = tf.clip_by_value(y0, 0, height), tf.clip_by_value(y1, 0, height)
    x0, x1 = tf.clip_by_value(x0, 0, width), tf.clip_by_value(x1, 0, width)

    def at(y: tf.Tensor, x: tf.Tensor) -> tf.Tensor:
        return tf.gather_nd(integral, tf.stack([y, x, channel], axis=1))

    total = at(y1, x1) - at(y0, x1) - at(y1, x0) + at(y0, x0)
    area = tf.maximum(y1 - y0, 0) * tf.maximum(x1 - x0, 0)
    return tf.cast(total, tf.float32) / tf.cast(tf.maximum(area, 1), tf.float32)


def refine_edges_by_mask(
    integral: tf.Tensor, channel: tf.Tensor, box: tuple[tf.Tensor, ...]
) -> tuple[tf.Tensor, ...]:
    """Moves each edge of the boxes by one pixel where a majority vote of the mask says so.

    The middle row/column can cross a JPEG jag, leaving an edge 1 px off. An edge moves out
    when the line just outside it is mostly mask, and in when its own line is mostly not
    mask. The lines skip the corner pixels.
    """
    y0, x0, y1, x1 = box

    def moved(edge: tf.Tensor, outside: tf.Tensor, own: tf.Tensor, out_step: int) -> tf.Tensor:
        return tf.where(outside > 0.5, edge + out_step, tf.where(own < 0.5, edge - out_step, edge))

    top_out = region_mean(integral, channel, y0 - 1, x0 + 1, y0, x1 - 1)
    top_own = region_mean(integral, channel, y0, x0 + 1, y0 + 1, x1 - 1)
    bottom_out = region_mean(integral, channel, y1, x0 + 1, y1 + 1, x1 - 1)
    bottom_own = region_mean(integral, channel, y1 - 1, x0 + 1, y1, x1 - 1)
    left_out = region_mean(integral, channel, y0 + 1, x0 - 1, y1 - 1, x0)
    left_own = region_mean(integral, channel, y0 + 1, x0, y1 - 1, x0 + 1)
    right_out = region_mean(integral, channel, y0 + 1, x1, y1 - 1, x1 + 1)
    right_own = region_mean(integral, channel, y0 + 1, x1 - 1, y1 - 1, x1)
    return (
        moved(y0, top_out, top_own, -1),
        moved(x0, left_out, left_own, -1),
        moved(y1, bottom_out, bottom_own, 1),
        moved(x1, right_out, right_own, 1),
    )


def line_sums(pixels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Prefix sums of float32 RGB pixels along rows [H, W+1, 3] and columns [H+1, W, 3].

    float32 is exact here: a sum along one line stays below 255 x 65536 < 2**24.
    """
    along_rows = tf.pad(tf.cumsum(pixels, axis=1), [[0, 0], [1, 0], [0, 0]])
    along_cols = tf.pad(tf.cumsum(pixels, axis=0), [[1, 0], [0, 0], [0, 0]])
    return along_rows, along_cols


def _line_mean(
    prefix: tf.Tensor, line: tf.Tensor, start: tf.Tensor, end: tf.Tensor, rows: bool
) -> tf.Tensor:
    """Mean colour [S, 3] of pixels start..end-1 of each row (rows=True, prefix along_rows)
    or each column (rows=False, prefix along_cols) numbered `line`."""
    line = tf.clip_by_value(line, 0, tf.shape(prefix)[0 if rows else 1] - 1)
    # Degenerate boxes (tiny images, candidates that collapsed) give an empty span.
    length = tf.shape(prefix)[1 if rows else 0] - 1
    start = tf.clip_by_value(start, 0, length)
    end = tf.clip_by_value(end, start, length)

    def at(position: tf.Tensor) -> tf.Tensor:
        index = [line, position] if rows else [position, line]
        return tf.gather_nd(prefix, tf.stack(index, axis=1))

    count = tf.cast(tf.maximum(end - start, 1), tf.float32)
    return (at(end) - at(start)) / count[:, tf.newaxis]


def refine_edges_by_colour(
    along_rows: tf.Tensor,
    along_cols: tf.Tensor,
    colour: tf.Tensor,
    box: tuple[tf.Tensor, ...],
) -> tuple[tf.Tensor, ...]:
    """Puts each edge where the colour is half-way between the class colour and the background.

    JPEG's 4:2:0 chroma subsampling (with libjpeg's smooth upsampling) turns the last pixel
    row of a rectangle into a blend whose colour can fall outside COLOUR_THRESHOLD when the
    background is far from the class colour, so the mask alone tends to lose that row. Here
    each line along an edge gets a blend factor alpha: its mean colour projected onto the
    segment from the background (the line 3 px outside) to the class `colour` [S, 3]. The
    edge moves out when the line just outside is more than half class colour, and in when its
    own line is less. A side within 3 px of the image border keeps its edge.
    """
    y0, x0, y1, x1 = box
    height = tf.shape(along_rows)[0]
    width = tf.shape(along_cols)[1]

    def alpha(line_colour: tf.Tensor, background: tf.Tensor) -> tf.Tensor:
        direction = colour - background
        weight = tf.reduce_sum(tf.square(direction), axis=1)
        projection = tf.reduce_sum((line_colour - background) * direction, axis=1)
        return projection / tf.maximum(weight, 1.0)

    def moved(
        edge: tf.Tensor, step: int, rows: bool, start: tf.Tensor, end: tf.Tensor
    ) -> tf.Tensor:
        # `step` is -1 for a top/left edge and +1 for a bottom/right one (outwards); `rows`
        # says whether the lines along the edge are rows or columns.
        prefix, limit = (along_rows, height) if rows else (along_cols, width)
        own_line = edge if step < 0 else edge - 1
        outside_line = edge - 1 if step < 0 else edge
        background_line = outside_line + 2 * step
        own = _line_mean(prefix, own_line, start, end, rows)
        outside = _line_mean(prefix, outside_line, start, end, rows)
        background = _line_mean(prefix, background_line, start, end, rows)
        usable = tf.logical_and(background_line >= 0, background_line < limit)
        new_edge = tf.where(
            alpha(outside, background) > 0.5,
            edge + step,
            tf.where(alpha(own, background) < 0.5, edge - step, edge),
        )
        return tf.where(usable, new_edge, edge)

    return (
        moved(y0, -1, True, x0 + 1, x1 - 1),
        moved(x0, -1, False, y0 + 1, y1 - 1),
        moved(y1, 1, True, x0 + 1, x1 - 1),
        moved(x1, 1, False, y0 + 1, y1 - 1),
    )


def score_boxes(
    integral: tf.Tensor,
    closeness_channel: tf.Tensor,
    mask_channel: tf.Tensor,
    box: tuple[tf.Tensor, ...],
) -> tf.Tensor:
    """Scores boxes: colour closeness x fill x (1 - leak), in [0, 1].

    - closeness: mean closeness over the box minus its 1-px rim, and
    - fill: the fraction of that same inner box covered by the cleaned class mask. The rim is
      left out of both because JPEG blends it with the background (and a box may be 1 px
      off), which would unfairly sink small rectangles.
    - leak: the largest mean closeness of a 1-px line parallel to a side, 2 px outside it
      (nothing beyond an image border). A box covering only part of a region leaks on the
      cut side and scores low; a box that is right to within 1 px does not.
    """
    y0, x0, y1, x1 = box
    closeness = region_mean(integral, closeness_channel, y0 + 1, x0 + 1, y1 - 1, x1 - 1)
    closeness = closeness / CLOSENESS_SCALE
    fill = region_mean(integral, mask_channel, y0 + 1, x0 + 1, y1 - 1, x1 - 1)
    strips = [
        (y0 - 2, x0, y0 - 1, x1),  # above
        (y1 + 1, x0, y1 + 2, x1),  # below
        (y0, x0 - 2, y1, x0 - 1),  # left
        (y0, x1 + 1, y1, x1 + 2),  # right
    ]
    leak = tf.zeros_like(closeness)
    for strip in strips:
        leak = tf.maximum(leak, region_mean(integral, closeness_channel, *strip))
    leak = leak / CLOSENESS_SCALE
    return tf.clip_by_value(closeness * fill * (1.0 - leak), 0.0, 1.0)
