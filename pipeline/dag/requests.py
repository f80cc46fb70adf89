"""A job step as the request SageMaker makes for it, and botocore's check of that request (offline)."""

from __future__ import annotations

from functools import cache
from typing import Any

from pipeline.dag.expressions import Context, evaluate
from pipeline.dag.graph import flatten_steps
from pipeline.errors import UserError

OPERATIONS = {
    "Processing": "CreateProcessingJob",
    "Training": "CreateTrainingJob",
    "RegisterModel": "CreateModelPackage",
}
JOB_NAMES = {"Processing": "ProcessingJobName", "Training": "TrainingJobName"}  # the member Pipelines adds itself
EXPRESSIONS = ("Get", "Std:Join", "Std:JsonGet")
PLACEHOLDERS = {"string": "placeholder", "integer": 1, "long": 1, "float": 1.0, "double": 1.0, "boolean": True}


class RequestError(UserError, ValueError):
    """A job request that SageMaker's API model refuses, said in one line."""


@cache
def _service() -> Any:
    import botocore.session

    return botocore.session.get_session().get_service_model("sagemaker")


def drop_none(node: Any) -> Any:
    """`node` without the None values the SDK leaves in optional fields."""
    if isinstance(node, dict):
        return {k: drop_none(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [drop_none(v) for v in node]
    return node


def resolve(step: dict, ctx: Context) -> dict:
    """The step's Arguments with every expression evaluated: the request for its job."""
    return drop_none(evaluate(step["Arguments"], ctx, f"step {step['Name']}"))


def placeholders(node: Any, shape: Any) -> Any:
    """`node` with each pipeline expression replaced by a value of the type `shape` expects there."""
    if isinstance(node, dict) and len(node) == 1 and next(iter(node)) in EXPRESSIONS:
        return PLACEHOLDERS[shape.type_name]
    if shape.type_name == "structure" and isinstance(node, dict):
        return {k: placeholders(v, shape.members[k]) if k in shape.members else v for k, v in node.items()}
    if shape.type_name == "list" and isinstance(node, list):
        return [placeholders(v, shape.member) for v in node]
    if shape.type_name == "map" and isinstance(node, dict):
        return {k: placeholders(v, shape.value) for k, v in node.items()}
    return node


def validate(request: dict, operation: str, what: str) -> None:
    """Check a request against botocore's model of `operation`; RequestError names `what` and the problems."""
    from botocore.validate import ParamValidator

    report = ParamValidator().validate(request, _service().operation_model(operation).input_shape)
    if report.has_errors():
        raise RequestError(f"{what}: invalid {operation} request: {' '.join(report.generate_report().split())}")


def check_job_steps(definition: dict) -> list[str]:
    """Validate every job step's Arguments (expressions as typed placeholders); the names of the steps checked."""
    checked = []
    for name, step in flatten_steps(definition["Steps"]).items():
        operation = OPERATIONS.get(step.get("Type"))
        if operation:
            shape = _service().operation_model(operation).input_shape
            request = placeholders(drop_none(step["Arguments"]), shape)
            if step["Type"] in JOB_NAMES:
                request[JOB_NAMES[step["Type"]]] = "placeholder"
            validate(request, operation, f"step {name}")
            checked.append(name)
    return checked
