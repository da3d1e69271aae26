"""Payload logging: what each model was asked and answered, as CloudEvents (issue 35.3).

sampling (which callers' requests, images as hash or in full; a TOML file reloaded on
change) -> writer (the pipeline's observer: a byte-budgeted queue drained by one thread,
never blocking a request) -> events (one CloudEvent per image) -> sinks (file, object
storage, HTTP). replay (`python -m gateway.paylog replay`) turns a log back into
detection-batch inputs.
"""
