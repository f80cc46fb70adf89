"""A local real-time endpoint: SageMaker's serving contract over HTTP on 127.0.0.1.

`handler` loads a model and calls its handlers as the Hugging Face CPU inference container does, `app` serves it
(a Starlette app on uvicorn: `LocalEndpoint` in a thread) and `process` runs it detached under uvicorn's process
manager (`start_background()` runs `python -m pipeline.local.endpoint ... --state-file F` and returns once it
serves, or swaps the model of the endpoint running there; `read_state(F)`, `stop_background(F)`); `supervisor` finds
every endpoint process of a local root. Differences from the container: `code/requirements.txt` is not installed,
a missing Content-Type is taken as `application/json`, and a failing `model_fn` fails `start()`/the swap instead of
every request.
"""

from __future__ import annotations

from pipeline.local.endpoint import supervisor
from pipeline.local.endpoint.app import ACCOUNT, EndpointStartError, LocalEndpoint
from pipeline.local.endpoint.handler import (
    JSON_TYPE,
    UTF8_TYPES,
    Context,
    EndpointError,
    LoadedModel,
    extract_model,
    serving_environment,
)
from pipeline.local.endpoint.process import (
    append_alert,
    count_restart,
    read_state,
    restarts,
    serve,
    start_background,
    stop_background,
)
from steps.contract import MAX_PAYLOAD_BYTES

__all__ = [
    "ACCOUNT",
    "JSON_TYPE",
    "MAX_PAYLOAD_BYTES",
    "UTF8_TYPES",
    "Context",
    "EndpointError",
    "EndpointStartError",
    "LoadedModel",
    "LocalEndpoint",
    "append_alert",
    "count_restart",
    "extract_model",
    "read_state",
    "restarts",
    "serve",
    "serving_environment",
    "start_background",
    "stop_background",
    "supervisor",
]
