"""Images, one job per module, in the order a request meets them:

formats (what the bytes are) -> jpeghead / header (size, orientation and limits, before any
pixel memory) -> decode (pixels, or the caller's bytes forwarded) -> resize (the size the
model takes) -> orientation (pixels and boxes as a viewer shows them). errors: what is
refused, as domain errors; pngmeta: PNG metadata too large to read.
"""
