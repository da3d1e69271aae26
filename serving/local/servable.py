"""One loaded model version: a TF1-style session over a SavedModel, like TF Serving's bundle.

`tf.compat.v1.saved_model.loader.load` restores the MetaGraphDef (with its full
signature_def map, `__saved_model_init_op` included) into a `tf.compat.v1.Session`, whose
`Session::Run` is the C++ path TF Serving uses. Runs go through the session's raw
`TF_SessionRun` wrapper rather than `Session.run`: the Python layer would cast feeds to
the placeholder dtype and check shapes, which TF Serving does not do. TensorFlow then
reports dtype mismatches itself (`Expects arg[0] to be uint8 but float is provided`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
from tensorflow.python.client import pywrap_tf_session

from serving.local.config import SessionSettings
from serving.local.errors import from_exception


class Servable:
    """A loaded SavedModel version that runs feeds and fetches by graph tensor name."""

    def __init__(self, name: str, version: int, path: str, settings: SessionSettings) -> None:
        self.name = name
        self.version = version
        self.path = path
        self._graph = tf.Graph()
        self._session = tf.compat.v1.Session(graph=self._graph, config=_session_config(settings))
        try:
            with self._graph.as_default():
                self.meta_graph: meta_graph_pb2.MetaGraphDef = tf.compat.v1.saved_model.loader.load(
                    self._session, list(settings.tags), path
                )
        except BaseException:
            self._session.close()
            raise
        self._outputs: dict[str, Any] = {}
        self._outputs_lock = threading.Lock()

    @property
    def signatures(self) -> Any:
        """The MetaGraphDef's signature_def map (alias -> SignatureDef)."""
        return self.meta_graph.signature_def

    def run(
        self,
        feeds: Sequence[tuple[str, np.ndarray]],
        fetches: Sequence[str],
        timeout_ms: int | None,
    ) -> list[np.ndarray]:
        """Session::Run; a positive timeout_ms becomes RunOptions.timeout_in_ms.

        Raises ServingError with TensorFlow's own status code and message.
        """
        try:
            feed_dict = {self._tf_output(name): value for name, value in feeds}
            fetch_list = [self._tf_output(name) for name in fetches]
        except (KeyError, ValueError) as exc:
            raise from_exception(exc) from None
        options = None
        if timeout_ms is not None:
            run_options = config_pb2.RunOptions(timeout_in_ms=timeout_ms)
            options = pywrap_tf_session.TF_NewBufferFromString(run_options.SerializeToString())
        try:
            outputs: list[np.ndarray] = self._session._call_tf_sessionrun(
                options, feed_dict, fetch_list, [], None
            )
            return outputs
        except (tf.errors.OpError, UnicodeDecodeError) as exc:
            raise from_exception(exc) from None
        finally:
            if options is not None:
                pywrap_tf_session.TF_DeleteBuffer(options)

    def close(self) -> None:
        self._session.close()

    def _tf_output(self, tensor_name: str) -> Any:
        """The C TF_Output for a graph tensor name, cached (graph lookups take a lock)."""
        output = self._outputs.get(tensor_name)
        if output is None:
            with self._outputs_lock:
                output = self._graph.get_tensor_by_name(tensor_name)._as_tf_output()
                self._outputs[tensor_name] = output
        return output


def _session_config(settings: SessionSettings) -> config_pb2.ConfigProto:
    return config_pb2.ConfigProto(
        intra_op_parallelism_threads=settings.intra_op_threads,
        inter_op_parallelism_threads=settings.inter_op_threads,
    )
