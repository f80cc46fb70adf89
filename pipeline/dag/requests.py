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
PROCESSING_INPUTS = "/opt/ml/processing/"  # ProcessingS3Input.LocalPath "must begin with" it (API reference)
PLACEHOLDERS = {"string": "placeholder", "integer": 1, "long": 1, "float": 1.0, "double": 1.0, "boolean": True}


class RequestError(UserError, ValueError):
    """A job request that SageMaker's API model refuses, said in one line."""


@cache
def service() -> Any:
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


def placeholders(node: Any, shape: Any, parameters: dict[str, str] | None = None, where: str = "") -> Any:
    """`node` with each pipeline expression replaced by a value of the type `shape` expects there. With the
    definition's `parameters` (name -> type), a parameter read directly where its type does not fit is a
    RequestError: CreatePipeline refuses an Integer in a string field ("Cannot assign property reference
    [Parameters.X] to argument of type [String]"), which Std:Join (the SDK's to_string()) turns into a string."""
    if isinstance(node, dict) and len(node) == 1 and next(iter(node)) in EXPRESSIONS:
        _check_parameter_type(node, shape.type_name, parameters or {}, where)
        return PLACEHOLDERS[shape.type_name]
    if shape.type_name == "structure" and isinstance(node, dict):
        return {k: placeholders(v, shape.members[k], parameters, f"{where}.{k}".lstrip("."))
                if k in shape.members else v for k, v in node.items()}
    if shape.type_name == "list" and isinstance(node, list):
        return [placeholders(v, shape.member, parameters, f"{where}[{i}]") for i, v in enumerate(node)]
    if shape.type_name == "map" and isinstance(node, dict):
        return {k: placeholders(v, shape.value, parameters, f"{where}.{k}") for k, v in node.items()}
    return node


def _check_parameter_type(node: dict, field_type: str, parameters: dict[str, str], where: str) -> None:
    reference = node.get("Get")
    if not (isinstance(reference, str) and reference.startswith("Parameters.")):
        return
    name = reference.removeprefix("Parameters.")
    kind = parameters.get(name)
    if kind is None or (kind == "String") == (field_type == "string"):
        return
    fix = "pass it through Std:Join (the SDK's .to_string())" if field_type == "string" else \
        "declare the parameter with the field's type"
    raise RequestError(f"{where}: Parameters.{name} is {kind}, the field takes a {field_type}: CreatePipeline "
                       f"refuses it (Cannot assign property reference [Parameters.{name}] to argument of type "
                       f"[{field_type.capitalize()}]); {fix}")


def validate(request: dict, operation: str, what: str) -> None:
    """Check a request against botocore's model of `operation`; RequestError names `what` and the problems."""
    from botocore.validate import ParamValidator

    report = ParamValidator().validate(request, service().operation_model(operation).input_shape)
    if report.has_errors():
        raise RequestError(f"{what}: invalid {operation} request: {' '.join(report.generate_report().split())}")


def check_job_steps(definition: dict) -> list[str]:
    """Validate every job step's Arguments (expressions as typed placeholders); the names of the steps checked."""
    checked = []
    for name, step in flatten_steps(definition["Steps"]).items():
        operation = OPERATIONS.get(step.get("Type"))
        if operation:
            shape = service().operation_model(operation).input_shape
            types = {p["Name"]: p.get("Type", "String") for p in definition.get("Parameters", [])}
            try:
                request = placeholders(drop_none(step["Arguments"]), shape, types)
            except RequestError as e:
                raise RequestError(f"step {name}: {e}") from None
            if step["Type"] in JOB_NAMES:
                request[JOB_NAMES[step["Type"]]] = "placeholder"
            for item in request.get("ProcessingInputs", []) if step["Type"] == "Processing" else []:
                path = (item.get("S3Input") or {}).get("LocalPath", PROCESSING_INPUTS)
                if not (isinstance(path, str) and path.startswith(PROCESSING_INPUTS)):
                    raise RequestError(f"step {name}: input {item.get('InputName')}: LocalPath {path!r}: expected "
                                       f"a path under {PROCESSING_INPUTS} (where SageMaker puts a processing input)")
            validate(request, operation, f"step {name}")
            checked.append(name)
    return checked
