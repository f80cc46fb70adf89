"""The local runner's interpretation of definition expressions and conditions."""

from __future__ import annotations

import json
import re

import pytest

from pipeline.dag.expressions import Context, ExpressionError, condition, evaluate, json_file_loader, property_path
from pipeline.dag.graph import StepGraph
from pipeline.dag.parameters import ParameterError, parse_pairs, resolve


@pytest.fixture
def ctx(tmp_path):
    report = tmp_path / "evaluation.json"
    report.write_text(json.dumps({"metrics": {"accuracy": {"value": 0.875}}, "classes": [{"f1": 0.5}]}))
    return Context(
        parameters={"Epochs": 3, "Threshold": 0.8, "Status": "Approved", "Name": "bert"},
        execution={"PipelineExecutionId": "abc123"},
        properties={"Tokenize": {"ProcessingOutputConfig": {"Outputs": {"test": {"S3Output": {"S3Uri": "s3://b/t"}}}}}},
        property_files={("Evaluate", "Report"): json_file_loader(report)},
    )


def json_get(path: str) -> dict:
    return {"Std:JsonGet": {"PropertyFile": {"Get": "Steps.Evaluate.PropertyFiles.Report"}, "Path": path}}


def test_get_parameters_execution_variables_and_step_properties(ctx):
    assert evaluate({"Get": "Parameters.Epochs"}, ctx, "s") == 3
    assert evaluate({"Get": "Execution.PipelineExecutionId"}, ctx, "s") == "abc123"
    reference = {"Get": "Steps.Tokenize.ProcessingOutputConfig.Outputs['test'].S3Output.S3Uri"}
    assert evaluate({"a": [reference]}, ctx, "s") == {"a": ["s3://b/t"]}


def test_join_stringifies_like_the_service(ctx):
    join = {
        "Std:Join": {
            "On": "/",
            "Values": ["s3://b", {"Get": "Execution.PipelineExecutionId"}, {"Get": "Parameters.Epochs"}],
        }
    }
    assert evaluate(join, ctx, "s") == "s3://b/abc123/3"
    assert evaluate({"Std:Join": {"On": "", "Values": [{"Get": "Parameters.Threshold"}]}}, ctx, "s") == "0.8"
    assert evaluate({"Std:Join": {"On": " ", "Values": [True, 1]}}, ctx, "s") == "true 1"


def test_json_get_reads_the_property_file(ctx):
    assert evaluate(json_get("metrics.accuracy.value"), ctx, "s") == 0.875
    assert evaluate(json_get("classes[0].f1"), ctx, "s") == 0.5
    # JsonPath from its root, as the developer guide's JsonGet takes it (build-and-manage-propertyfile)
    assert evaluate(json_get("$.metrics.accuracy.value"), ctx, "s") == 0.875
    assert evaluate(json_get("$['metrics']['accuracy']['value']"), ctx, "s") == 0.875
    with pytest.raises(ExpressionError, match="no value at 'precision'"):
        evaluate(json_get("metrics.precision.value"), ctx, "s")


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        ({"Type": "Equals", "LeftValue": {"Get": "Parameters.Status"}, "RightValue": "Approved"}, True),
        ({"Type": "Equals", "LeftValue": {"Get": "Parameters.Status"}, "RightValue": "Rejected"}, False),
        ({"Type": "GreaterThan", "LeftValue": json_get("metrics.accuracy.value"), "RightValue": 0.875}, False),
        (
            {
                "Type": "GreaterThanOrEqualTo",
                "LeftValue": json_get("metrics.accuracy.value"),
                "RightValue": {"Get": "Parameters.Threshold"},
            },
            True,
        ),
        ({"Type": "LessThan", "LeftValue": {"Get": "Parameters.Epochs"}, "RightValue": 4}, True),
        ({"Type": "LessThanOrEqualTo", "LeftValue": {"Get": "Parameters.Epochs"}, "RightValue": 2}, False),
        ({"Type": "In", "QueryValue": {"Get": "Parameters.Name"}, "Values": ["roberta", "bert"]}, True),
        ({"Type": "Not", "Condition": {"Type": "Equals", "LeftValue": 1, "RightValue": 1}}, False),
        (
            {
                "Type": "Or",
                "Conditions": [
                    {"Type": "Equals", "LeftValue": 1, "RightValue": 2},
                    {"Type": "LessThan", "LeftValue": 1, "RightValue": 2},
                ],
            },
            True,
        ),
        ({"Type": "GreaterThanOrEqualTo", "LeftValue": "0.9", "RightValue": 0.85}, True),
    ],
)
def test_every_condition_type(ctx, cond, expected):
    assert condition(cond, ctx, "step Gate") is expected


def test_a_not_condition_as_the_sdk_writes_it(ctx):
    from sagemaker.core.workflow.conditions import ConditionEquals, ConditionNot

    written = ConditionNot(expression=ConditionEquals(left=1, right=1)).to_request()
    assert condition(written, ctx, "step Gate") is False


def test_a_malformed_condition_is_an_expression_error(ctx):
    with pytest.raises(ExpressionError, match="step Gate: malformed Not condition"):
        condition({"Type": "Not", "Expression": {"Type": "Equals", "LeftValue": 1, "RightValue": 1}}, ctx, "step Gate")


def test_unsupported_expressions_name_the_step_and_the_expression(ctx):
    with pytest.raises(ExpressionError, match=r"step Train: unsupported expression Std:Concat"):
        evaluate({"Std:Concat": ["a"]}, ctx, "step Train")
    with pytest.raises(ExpressionError, match=r"step Gate: unsupported condition type 'Between'"):
        condition({"Type": "Between"}, ctx, "step Gate")
    with pytest.raises(ExpressionError, match=r"step X: unknown parameter in \{'Get': 'Parameters.Nope'\}"):
        evaluate({"Get": "Parameters.Nope"}, ctx, "step X")
    with pytest.raises(ExpressionError, match="unsupported execution variable"):
        evaluate({"Get": "Execution.Unknown"}, ctx, "step X")
    with pytest.raises(ExpressionError, match="step Train has no properties yet"):
        evaluate({"Get": "Steps.Train.ModelArtifacts.S3ModelArtifacts"}, ctx, "step X")


def test_property_paths():
    assert property_path("ProcessingOutputConfig.Outputs['test'].S3Output.S3Uri") == [
        "ProcessingOutputConfig",
        "Outputs",
        "test",
        "S3Output",
        "S3Uri",
    ]
    assert property_path('a["b c"][2].d') == ["a", "b c", 2, "d"]
    with pytest.raises(ValueError):
        property_path("a..b")


def test_parameters_are_cast_to_their_declared_types():
    declared = [
        {"Name": "Epochs", "Type": "Integer", "DefaultValue": 2},
        {"Name": "Rate", "Type": "Float", "DefaultValue": 0.1},
        {"Name": "Flag", "Type": "Boolean", "DefaultValue": False},
        {"Name": "Name", "Type": "String", "DefaultValue": "x"},
    ]
    assert resolve({"Parameters": declared, "Steps": []}, {"Epochs": "5", "Rate": "1e-3", "Flag": "true"}) == {
        "Epochs": 5,
        "Rate": 0.001,
        "Flag": True,
        "Name": "x",
    }
    with pytest.raises(ParameterError, match="--param Epochs='five': expected an Integer"):
        resolve({"Parameters": declared, "Steps": []}, {"Epochs": "five"})
    with pytest.raises(ParameterError, match="--param Epoch: unknown parameter; expected one of"):
        resolve({"Parameters": declared, "Steps": []}, {"Epoch": "1"})
    # StartPipelineExecution refuses an empty value or one over 1024 characters: so do both backends
    with pytest.raises(ParameterError, match="--param Name=: empty; expected a String"):
        resolve({"Parameters": declared, "Steps": []}, {"Name": ""})
    with pytest.raises(ParameterError, match="--param Name: 1025 characters; expected at most 1024"):
        resolve({"Parameters": declared, "Steps": []}, {"Name": "x" * 1025})


@pytest.fixture(scope="module")
def shipped_s3_dag(no_network_module) -> dict:
    from pipeline.config import load_config
    from pipeline.definition import definition

    return json.loads(definition(load_config("pipeline.yaml", ["data.source=s3://bucket/reviews/"], environ={})))


@pytest.mark.parametrize(("override", "message"), [
    ({"ModelApprovalStatus": "approved"}, "--param ModelApprovalStatus='approved': RegisterModel.ModelApprovalStatus "
     "takes it, and SageMaker would refuse it there: expected one of Approved, Rejected, PendingManualApproval"),
    ({"InputData": "s3://bucket/reviews(2024)/"}, "--param InputData='s3://bucket/reviews(2024)/': RegisterModel."
     "CustomerMetadataProperties.data_source takes it, and SageMaker would refuse it there: expected characters"),
    ({"AccuracyThreshold": "85"}, "--param AccuracyThreshold=85: expected an accuracy between 0 and 1"),
])
def test_a_value_the_jobs_would_refuse_is_refused_at_start_not_after_training(shipped_s3_dag, override, message):
    """StartPipelineExecution checks no value: a typo in ModelApprovalStatus failed RegisterModel after the whole
    training, an S3 prefix with '(' likewise (the version's metadata has a narrower alphabet), a percent threshold
    failed every gate."""
    with pytest.raises(ParameterError, match=re.escape(message)):
        resolve(shipped_s3_dag, override)
    fine = {"ModelApprovalStatus": "Approved", "InputData": "s3://bucket/reviews-2024/Ünï/",
            "AccuracyThreshold": "0.85", "TrainInstanceType": "ml.trn3.48xlarge"}  # a type newer than botocore's list
    assert resolve(shipped_s3_dag, fine)["ModelApprovalStatus"] == "Approved"


def test_graph_orders_by_data_dependencies_and_depends_on():
    definition = {
        "Steps": [
            {"Name": "C", "Type": "Fail", "Arguments": {"ErrorMessage": {"Get": "Steps.B.X"}}},
            {"Name": "B", "Type": "Processing", "Arguments": {"x": {"Get": "Steps.A.Y"}}},
            {"Name": "A", "Type": "Processing", "Arguments": {}, "DependsOn": ["D"]},
            {"Name": "D", "Type": "Processing", "Arguments": {}},
        ]
    }
    assert StepGraph(definition).order == ["D", "A", "B", "C"]
    with pytest.raises(ExpressionError, match="circular dependency"):
        StepGraph(
            {
                "Steps": [
                    {"Name": "A", "Type": "Processing", "DependsOn": ["B"]},
                    {"Name": "B", "Type": "Processing", "DependsOn": ["A"]},
                ]
            }
        )
    with pytest.raises(ExpressionError, match="step A: depends on unknown step Z"):
        StepGraph({"Steps": [{"Name": "A", "Type": "Processing", "Arguments": {"x": {"Get": "Steps.Z.Y"}}}]})


def test_parameter_pairs_are_parsed_once_and_the_data_source_cannot_switch_form():
    assert parse_pairs(["Epochs=3", "InputData=s3://b/k=v"]) == {"Epochs": "3", "InputData": "s3://b/k=v"}
    for bad in ("Epochs", "=3"):
        with pytest.raises(ParameterError, match="expected NAME=VALUE"):
            parse_pairs([bad])
    declared = [{"Name": "InputData", "Type": "String", "DefaultValue": "amazon_polarity"}]
    staged = {"Get": "Parameters.InputData"}
    with_s3 = {"Parameters": declared, "Steps": [
        {"Name": "Tokenize", "Type": "Processing", "Arguments": {"ProcessingInputs": [{"S3Input": {"S3Uri": staged}}]}}
    ]}
    without = {"Parameters": declared, "Steps": [{"Name": "Tokenize", "Type": "Processing", "Arguments": {}}]}
    assert resolve(without, {"InputData": "sample:100"})["InputData"] == "sample:100"
    assert resolve(with_s3, {"InputData": "s3://b/new/"})["InputData"] == "s3://b/new/"
    with pytest.raises(ParameterError, match="built for a Hub or sample data.source"):
        resolve(without, {"InputData": "s3://b/new/"})
    with pytest.raises(ParameterError, match="built for an s3:// data.source"):
        resolve(with_s3, {"InputData": "amazon_polarity"})


def test_the_local_runner_knows_every_execution_variable_the_sdk_writes():
    """Each of the SDK's ExecutionVariables resolves in a local job step (the job names inside their own step), and
    CurrentDateTime is the time it is read."""
    from sagemaker.core.workflow.execution_variables import ExecutionVariables

    from pipeline.local.execution import Execution, ExecutionState

    names = {getattr(ExecutionVariables, n).name for n in dir(ExecutionVariables) if n.isupper()}
    state = ExecutionState(Execution.new("demo", {}, {}), StepGraph({"Steps": []}), None)
    job_names = {"TrainingJobName", "ProcessingJobName"}
    for name in names - job_names:
        assert evaluate({"Get": f"Execution.{name}"}, state.context, "step S"), name
    arn = evaluate({"Get": "Execution.PipelineArn"}, state.context, "step S")
    assert arn == "arn:aws:sagemaker:local:000000000000:pipeline/demo"
    named = ExecutionState(Execution.new("Demo-BERT", {}, {}), StepGraph({"Steps": []}), None).context
    pipeline_arn, execution_arn = (evaluate({"Get": f"Execution.{n}"}, named, "step S")
                                   for n in ("PipelineArn", "PipelineExecutionArn"))
    assert pipeline_arn.endswith(":pipeline/demo-bert") and execution_arn.startswith(pipeline_arn + "/execution/")
    first = evaluate({"Get": "Execution.CurrentDateTime"}, state.context, "step S")
    assert first >= evaluate({"Get": "Execution.StartDateTime"}, state.context, "step S")
