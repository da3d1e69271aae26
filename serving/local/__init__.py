"""A local stand-in for `tensorflow_model_server`, wire-compatible for the gRPC API.

Run it as `python -m serving.local` with TF Serving's own flags (see `flags.py`). It loads
SavedModels with TensorFlow's C++ session (the path TF Serving uses) and answers
PredictionService and ModelService RPCs with TF Serving's status codes and messages.

Data path: `flags` -> `config` (model list) -> `manager` (versions: `versions`, `servable`,
`warmup`) -> `core` (`predict`, `tensors`) -> `servicers` -> `server`.
Importing this package does not import TensorFlow.
"""
