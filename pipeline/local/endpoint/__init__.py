"""A local real-time endpoint: SageMaker's serving contract over HTTP on 127.0.0.1.

`handler` loads a model and calls its handlers as the Hugging Face CPU inference container does, `server` serves
it (`LocalEndpoint` in a thread, `serve_forever()` in the foreground; `framing` reads request bodies as HTTP/1.1
frames them) and `daemon` runs it detached
(`start_background()` runs `python -m pipeline.local.endpoint ... --state-file F` and returns once it serves;
`read_state(F)`, `stop_background(F)`). Differences from the container: `code/requirements.txt` is not installed,
a missing Content-Type is taken as `application/json`, and a failing `model_fn` fails `start()`/`update()` instead
of every request.
"""

from __future__ import annotations

from pipeline.local.endpoint import supervisor
from pipeline.local.endpoint.daemon import EndpointStartError, read_state, start_background, stop_background
from pipeline.local.endpoint.handler import (
    JSON_TYPE,
    UTF8_TYPES,
    Context,
    EndpointError,
    LoadedModel,
    extract_model,
    serving_environment,
)
from pipeline.local.endpoint.server import ACCOUNT, LocalEndpoint, serve_forever
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
    "extract_model",
    "read_state",
    "serve_forever",
    "serving_environment",
    "start_background",
    "stop_background",
    "supervisor",
]
