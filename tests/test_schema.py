"""The definition against what AWS publishes about what the service accepts.

1. SageMaker's pipeline definition JSON schema (tests/schema/, source and version in SOURCE.md). The schema lags
   the service: each known lag below carries its evidence, checked here where a machine can check it (botocore's
   sagemaker service model, the SDK's own output). Every other violation fails the test, and a listed lag that no
   longer occurs fails it too, so the list stays exact.
2. botocore's sagemaker service model: each job step's Arguments is the request SageMaker makes for it
   (CreateProcessingJob, CreateTrainingJob, CreateModelPackage); with its expressions replaced by placeholders of
   the type the model expects there, it must pass botocore's own ParamValidator.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import botocore.session
import pytest
from botocore.validate import ParamValidator
from jsonschema import Draft7Validator

from pipeline.config import load_config
from pipeline.dag.graph import flatten_steps
from pipeline.dag.requests import RequestError, check_job_steps, placeholders
from pipeline.definition import definition

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = json.loads((Path(__file__).parent / "schema" / "pipeline-definition.schema.json").read_text())
STEP_SCHEMA = {
    kind: name
    for name, spec in SCHEMA["definitions"].items()
    if name.endswith("Step")
    for kind in reversed(spec["properties"]["Type"].get("enum", []))  # EndpointConfigStep reuses "Endpoint"
}
BRANCH_STEP_TYPES = {
    SCHEMA["definitions"][ref["$ref"].rsplit("/", 1)[1]]["properties"]["Type"]["enum"][0]
    for ref in SCHEMA["definitions"]["ConditionStep"]["properties"]["Arguments"]["properties"]["IfSteps"]["items"][
        "oneOf"
    ]
}
SERVICE = botocore.session.get_session().get_service_model("sagemaker")
EXPRESSIONS = ("Get", "Std:Join", "Std:JsonGet")


@pytest.fixture(scope="module")
def dag(no_network_module) -> dict:
    return json.loads(definition(load_config(ROOT / "pipeline.yaml", environ={})))


@dataclass(frozen=True)
class Violation:
    scope: str  # "pipeline" or "<Type> step"
    path: str  # inside the scope, list indices as []
    kind: str


def _path(error) -> str:
    return ".".join("[]" if isinstance(p, int) else str(p) for p in error.absolute_path).replace(".[]", "[]")


def _kind(error) -> str:
    if error.validator == "additionalProperties":
        return "unexpected " + ", ".join(sorted(re.findall(r"'([^']+)'", error.message.split("(")[-1])))
    instance = error.instance
    if error.validator in ("oneOf", "anyOf") and isinstance(instance, dict) and len(instance) == 1:
        return f"{next(iter(instance))} expression"
    if _path(error).endswith("ExceptionType"):
        return "ExceptionType is a list"
    return f"{error.validator}: {error.message[:120]}"


def leaves(error):
    """The errors under a oneOf / anyOf over typed alternatives (conditions): those of the alternative whose "Type"
    matches the instance's; any other error as it is."""
    instance = error.instance
    if error.validator in ("oneOf", "anyOf") and error.context and isinstance(instance, dict) and "Type" in instance:
        branches: dict = {}
        for sub in error.context:
            branches.setdefault(sub.relative_schema_path[0], []).append(sub)
        matching = [subs for subs in branches.values() if not any(list(x.relative_path) == ["Type"] for x in subs)]
        if matching:
            for sub in matching[0]:
                yield from leaves(sub)
            return
    yield error


def check(schema: dict, instance: dict, scope: str) -> set[Violation]:
    return {Violation(scope, _path(e), _kind(e)) for top in Draft7Validator(schema).iter_errors(instance)
            for e in leaves(top)}


def violations(dag: dict) -> set[Violation]:
    """Every violation: the pipeline without its steps, then each step (branches included) against its own type's
    schema with its branches emptied, and the types of the steps in each branch."""
    found = check(SCHEMA, {**dag, "Steps": []}, "pipeline")
    for step in flatten_steps(dag["Steps"]).values():
        own = json.loads(json.dumps(step))
        if step["Type"] == "Condition":
            branches = [s for key in ("IfSteps", "ElseSteps") for s in own["Arguments"].pop(key, [])]
            own["Arguments"].update(IfSteps=[], ElseSteps=[])
            found |= {
                Violation("Condition step", "Arguments.IfSteps|ElseSteps", f"a {s['Type']} step in a branch")
                for s in branches
                if s["Type"] not in BRANCH_STEP_TYPES
            }
        schema = {"$ref": f"#/definitions/{STEP_SCHEMA[step['Type']]}", "definitions": SCHEMA["definitions"]}
        found |= check(schema, own, f"{step['Type']} step")
    return found


def members(shape: str) -> set[str]:
    return set(SERVICE.shape_for(shape).members)


def sdk_source(module: str, name: str) -> str:
    import importlib

    return inspect.getsource(getattr(importlib.import_module(module), name))


def _join() -> bool:
    from sagemaker.core.workflow import Join

    referenced = '"#/definitions/JoinFunction"' in json.dumps(SCHEMA)
    return "Std:Join" in Join(on="/", values=["s3://b", "k"]).expr and not referenced


def _json_get() -> bool:
    from sagemaker.core.workflow import JsonGet

    return "Std:JsonGet" in JsonGet(step_name="Evaluate", property_file="Report", json_path="a.b").expr


def _retry_list() -> bool:
    from sagemaker.mlops.workflow.retry import SageMakerJobExceptionTypeEnum, SageMakerJobStepRetryPolicy

    policy = SageMakerJobStepRetryPolicy(exception_types=[SageMakerJobExceptionTypeEnum.CAPACITY_ERROR], max_attempts=2)
    return isinstance(policy.to_request()["ExceptionType"], list)


def _any_step_in_a_branch() -> bool:
    from sagemaker.mlops.workflow.condition_step import ConditionStep
    from sagemaker.mlops.workflow.lambda_step import LambdaStep
    from sagemaker.mlops.workflow.steps import Step

    annotation = inspect.signature(ConditionStep.__init__).parameters["if_steps"].annotation
    return "List[sagemaker.mlops.workflow.steps.Step]" in str(annotation) and issubclass(LambdaStep, Step)


@dataclass(frozen=True)
class Lag:
    """A place where the schema lags the service, with its evidence (checked where `check` is given)."""

    matches: Callable[[Violation], bool]
    evidence: str
    check: Callable[[], bool]


LAGS = {
    "the SDK v3 writes MlflowConfig and PipelineExperimentConfig at the top": Lag(
        lambda v: v.scope == "pipeline" and v.kind == "unexpected MlflowConfig, PipelineExperimentConfig",
        "sagemaker-mlops Pipeline.definition() emits both; botocore has the PipelineExperimentConfig shape",
        lambda: "MlflowConfig" in sdk_source("sagemaker.mlops.workflow.pipeline", "Pipeline")
        and "PipelineExperimentConfig" in SERVICE.shape_names,
    ),
    "Std:Join where a value goes": Lag(
        lambda v: v.kind == "Std:Join expression",
        "the schema defines JoinFunction but references it nowhere; the SDK's Join emits Std:Join; AWS docs "
        "(build-and-manage-propertyfile.html) pass S3 URIs as Std:Join",
        _join,
    ),
    "Std:JsonGet in a condition and a message": Lag(
        lambda v: v.kind == "Std:JsonGet expression",
        "the SDK's JsonGet emits Std:JsonGet (aws/sagemaker-python-sdk#2506, JsonGet for all step types); the "
        "schema has no JsonGet rule",
        _json_get,
    ),
    "RetryPolicies[].ExceptionType is a list": Lag(
        lambda v: v.path.endswith("RetryPolicies[].ExceptionType") and v.kind == "ExceptionType is a list",
        'AWS docs pipelines-retry-policy.html: "ExceptionType": [String]; the SDK emits a list',
        _retry_list,
    ),
    "a training job's Environment": Lag(
        lambda v: v.scope == "Training step" and v.path == "Arguments" and v.kind == "unexpected Environment",
        "botocore CreateTrainingJobRequest has Environment",
        lambda: "Environment" in members("CreateTrainingJobRequest"),
    ),
    "a processing step's PropertyFiles": Lag(
        lambda v: v.scope == "Processing step" and v.path == "" and v.kind == "unexpected PropertyFiles",
        "the SDK's ProcessingStep writes PropertyFiles, which Std:JsonGet reads (build-and-manage-propertyfile.html)",
        lambda: "PropertyFiles" in sdk_source("sagemaker.mlops.workflow.steps", "ProcessingStep"),
    ),
    "CreateModelPackage's newer members": Lag(
        lambda v: v.scope == "RegisterModel step"
        and v.path == "Arguments"
        and v.kind == ("unexpected AdditionalInferenceSpecifications, CustomerMetadataProperties, "
                       "ModelApprovalStatus, SkipModelValidation"),
        "botocore CreateModelPackageInput has AdditionalInferenceSpecifications, CustomerMetadataProperties, "
        "ModelApprovalStatus, SkipModelValidation",
        lambda: {"AdditionalInferenceSpecifications", "CustomerMetadataProperties", "ModelApprovalStatus",
                 "SkipModelValidation"} <= members("CreateModelPackageInput"),
    ),
    "a model package container's Environment": Lag(
        lambda v: v.scope == "RegisterModel step"
        and v.path == "Arguments.InferenceSpecification.Containers[]"
        and v.kind == "unexpected Environment",
        "botocore ModelPackageContainerDefinition has Environment",
        lambda: "Environment" in members("ModelPackageContainerDefinition"),
    ),
    "a Lambda step in a condition branch": Lag(
        lambda v: v.scope == "Condition step" and v.kind == "a Lambda step in a branch",
        "the SDK's ConditionStep takes any step in if_steps; the schema's branch list predates LambdaStep "
        "(sagemaker-mlops condition_step.py; AWS docs build-and-manage-steps.html#step-type-lambda)",
        _any_step_in_a_branch,
    ),
}


def test_the_schema_is_the_shipped_version():
    assert SCHEMA["properties"]["Version"]["enum"] == ["2020-12-01"]
    Draft7Validator.check_schema(SCHEMA)


def test_the_definition_validates_but_for_the_known_lags_of_the_schema(dag):
    assert dag["Version"] == "2020-12-01"
    found = violations(dag)
    unexplained = sorted((v.scope, v.path, v.kind) for v in found if not any(lag.matches(v) for lag in LAGS.values()))
    assert not unexplained, f"schema violations that are not known lags of the schema: {unexplained}"
    stale = [name for name, lag in LAGS.items() if not any(lag.matches(v) for v in found)]
    assert not stale, f"listed lags that no longer occur (remove them): {stale}"


@pytest.mark.parametrize("name", list(LAGS))
def test_each_lag_has_its_evidence(name):
    assert LAGS[name].check(), f"{name}: the evidence no longer holds ({LAGS[name].evidence})"


def test_no_condition_step_inside_another(dag):
    """Pipelines does not support nested condition steps (the schema and the developer guide agree)."""
    for step in flatten_steps(dag["Steps"]).values():
        if step["Type"] == "Condition":
            branches = step["Arguments"]["IfSteps"] + step["Arguments"]["ElseSteps"]
            assert all(s["Type"] != "Condition" for s in branches), step["Name"]


@pytest.mark.parametrize(
    ("step", "operation", "name"),
    [
        ("Tokenize", "CreateProcessingJob", {"ProcessingJobName": "tokenize"}),
        ("Train", "CreateTrainingJob", {"TrainingJobName": "train"}),
        ("Evaluate", "CreateProcessingJob", {"ProcessingJobName": "evaluate"}),
        ("RegisterModel", "CreateModelPackage", {}),
    ],
)
def test_each_job_step_is_a_valid_request_of_the_service_model(dag, step, operation, name):
    """The job name is the one member Pipelines adds itself; everything else is the step's Arguments."""
    shape = SERVICE.operation_model(operation).input_shape
    request = {**placeholders(flatten_steps(dag["Steps"])[step]["Arguments"], shape), **name}
    report = ParamValidator().validate(request, shape)
    assert not report.has_errors(), report.generate_report()


@pytest.mark.parametrize(("field", "value", "message"), [
    ("ContainerArguments", [{"Get": "Parameters.BatchSize"}],
     "AppSpecification.ContainerArguments[0]: Parameters.BatchSize is Integer, the field takes a string"),
    ("ContainerEntrypoint", [{"Std:Join": {"On": "", "Values": [{"Get": "Parameters.BatchSize"}]}}], None),
])
def test_a_parameter_read_where_its_type_does_not_fit_is_refused_before_create_pipeline(field, value, message):
    """CreatePipeline: "Cannot assign property reference [Parameters.X] to argument of type [String]" (the SDK's
    issues 2631, 4867); botocore's model cannot see it, a placeholder of the field's type hid it."""
    dag = {"Parameters": [{"Name": "BatchSize", "Type": "Integer", "DefaultValue": 16}], "Steps": [{
        "Name": "Edit", "Type": "Processing", "Arguments": {
            "AppSpecification": {"ImageUri": "image", field: value},
            "ProcessingResources": {"ClusterConfig": {"InstanceCount": {"Get": "Parameters.BatchSize"},
                                                      "InstanceType": "ml.m5.xlarge", "VolumeSizeInGB": 30}},
            "RoleArn": "arn:aws:iam::123456789012:role/r"}}]}
    if message is None:
        assert check_job_steps(dag) == ["Edit"]
    else:
        with pytest.raises(RequestError, match=re.escape(f"step Edit: {message}: CreatePipeline refuses it")):
            check_job_steps(dag)


def test_a_processing_input_outside_opt_ml_processing_is_refused():
    """ProcessingS3Input.LocalPath must begin with /opt/ml/processing/; the local runner wrote such an input on the
    host (/data, say) and ran."""
    dag = {"Steps": [{"Name": "Edit", "Type": "Processing", "Arguments": {
        "AppSpecification": {"ImageUri": "image"},
        "ProcessingInputs": [{"InputName": "data", "S3Input": {
            "S3Uri": "s3://b/d", "LocalPath": "/data", "S3DataType": "S3Prefix", "S3InputMode": "File"}}],
        "ProcessingResources": {"ClusterConfig": {"InstanceCount": 1, "InstanceType": "ml.m5.xlarge",
                                                  "VolumeSizeInGB": 30}},
        "RoleArn": "arn:aws:iam::123456789012:role/r"}}]}
    with pytest.raises(RequestError, match="step Edit: input data: LocalPath '/data': expected a path under "
                                           "/opt/ml/processing/"):
        check_job_steps(dag)
    dag["Steps"][0]["Arguments"]["ProcessingInputs"][0]["S3Input"]["LocalPath"] = "/opt/ml/processing/input/data"
    assert check_job_steps(dag) == ["Edit"]


def test_the_placeholders_keep_what_the_model_checks():
    """A request with an unknown member or a wrong type still fails: the placeholders hide nothing else."""
    shape = SERVICE.operation_model("CreateTrainingJob").input_shape
    bad = placeholders({"TrainingJobName": {"Get": "Parameters.X"}, "Nonsense": 1, "RoleArn": 5}, shape)
    assert bad["TrainingJobName"] == "placeholder"
    text = ParamValidator().validate(bad, shape).generate_report()
    assert "Nonsense" in text and "RoleArn" in text
