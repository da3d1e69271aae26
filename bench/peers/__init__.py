"""What users would pick instead of the gateway, each in front of the same bench upstream.

- `seed002`: a synchronous grpcio gateway (Pillow, `tf.make_tensor_proto`, the official
  stub), the project's own venv;
- `kserve_transformer`: a KServe 0.21 custom transformer served by `kserve.ModelServer`,
  its own venv;
- `mlserver_runtime` (+ `mlserver_tool` to start and call it): an MLServer 1.7 custom
  runtime, its own venv.

`make peers` builds the two venvs from the pinned lists beside this file
(bench/peers/venvs.py); `python -m bench.peers` measures all of them against the gateway
(bench/peers/__main__.py), in the project's venv: `servers` starts each server and knows its
doors (`processes`: the process trees, their CPU and RSS; `answers`: each door's answer read
back and checked), `runs` measures one run, `report` writes the section of bench/results.md.
This package imports nothing itself: each peer imports only its own venv's packages and
bench.peers.odapi.
"""
