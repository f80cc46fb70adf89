"""What a hand-written AWS fake must hold to: botocore's service model, for its requests and its errors.

moto answers most calls, and botocore validates those requests before they reach it. Where a test answers a call
by hand (moto lacks UpdateEndpoint, or the test plays a race), `validated` checks the request against the
operation's input shape exactly as botocore does before it sends one, and `service_error` builds the error
through botocore's own parser from the body the service sends (JSON, or S3's XML), so the code under test sees what it
would see from SageMaker.
"""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import ClientError
from botocore.parsers import create_parser
from botocore.validate import validate_parameters


def validated(client: Any, method: str, params: dict) -> dict:
    """`params` of `client.<method>`, after botocore's own validation against the operation's input shape (a
    ParamValidationError names the first wrong or missing field, as a real call would raise)."""
    operation = client.meta.service_model.operation_model(client.meta.method_to_api_mapping[method])
    validate_parameters(params, operation.input_shape)
    return params


def service_error(client: Any, method: str, code: str, message: str, status: int = 400) -> ClientError:
    """The ClientError botocore raises when the service answers `status` with error `code` and `message`."""
    model = client.meta.service_model
    operation = model.operation_model(client.meta.method_to_api_mapping[method])
    if model.protocol == "rest-xml":  # S3
        body = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
        headers = {"content-type": "application/xml"}
    else:
        body = json.dumps({"__type": code, "message": message}).encode()
        headers = {"content-type": f"application/x-amz-json-{model.metadata.get('jsonVersion', '1.1')}"}
    parsed = create_parser(model.protocol).parse({"status_code": status, "headers": headers, "body": body},
                                                 operation.output_shape)
    return ClientError(parsed, operation.name)
