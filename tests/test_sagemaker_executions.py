"""Listing executions and their parameters page through what SageMaker returns (both operations are paginated,
and ListPipelineExecutions takes MaxResults up to 100), against botocore's Stubber, which checks every request."""

from __future__ import annotations

import pytest
from botocore.stub import ANY, Stubber

from pipeline.sagemaker import executions
from pipeline.sagemaker.aws import Aws

EXECUTION = "arn:aws:sagemaker:us-east-1:123456789012:pipeline/p/execution/{}"


@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    return Aws("us-east-1")


def test_more_executions_than_one_page_holds_are_listed_in_pages_of_at_most_100(aws, monkeypatch):
    client = aws.client("sagemaker")
    sent = []
    client.meta.events.register("provide-client-params.sagemaker.ListPipelineExecutions",
                                lambda params, **_: sent.append(dict(params)))
    summaries = [{"PipelineExecutionArn": EXECUTION.format(i)} for i in range(150)]
    request = {"PipelineName": "p", "SortBy": "CreationTime", "SortOrder": "Descending", "MaxResults": ANY}
    monkeypatch.setattr(executions, "describe", lambda aws, arn, with_parameters: arn)
    with Stubber(client) as stub:
        stub.add_response("list_pipeline_executions",
                          {"PipelineExecutionSummaries": summaries[:100], "NextToken": "next"}, request)
        stub.add_response("list_pipeline_executions", {"PipelineExecutionSummaries": summaries[100:]},
                          {**request, "NextToken": "next"})
        assert executions.recent(aws, "p", limit=150) == [s["PipelineExecutionArn"] for s in summaries]
    assert len(sent) == 2 and all(1 <= params["MaxResults"] <= 100 for params in sent)


def test_an_executions_parameters_are_read_from_every_page(aws, monkeypatch):
    client = aws.client("sagemaker")
    arn = EXECUTION.format("e1")
    monkeypatch.setattr(Aws, "execution_steps", lambda self, arn: [])
    with Stubber(client) as stub:
        stub.add_response("describe_pipeline_execution", {"PipelineExecutionArn": arn,
                                                          "PipelineExecutionStatus": "Succeeded"})
        stub.add_response("list_pipeline_parameters_for_execution",
                          {"PipelineParameters": [{"Name": "Epochs", "Value": "3"}], "NextToken": "next"},
                          {"PipelineExecutionArn": arn})
        stub.add_response("list_pipeline_parameters_for_execution",
                          {"PipelineParameters": [{"Name": "InputData", "Value": "s3://b/new/"}]},
                          {"PipelineExecutionArn": arn, "NextToken": "next"})
        view = executions.describe(aws, arn)
    assert view.parameters == {"Epochs": "3", "InputData": "s3://b/new/"}


def test_waiting_ends_at_every_status_the_api_calls_an_end(aws, monkeypatch):
    """PipelineExecutionStatus (botocore's model): all but Executing and Stopping are ends; `start --wait` must not
    poll for ever on CompletedWithFailures (a run with StepDependency conditions)."""
    import botocore.session

    from pipeline.records import ExecutionView

    statuses = botocore.session.get_session().get_service_model("sagemaker").shape_for("PipelineExecutionStatus").enum
    for end in set(statuses) - {"Executing", "Stopping"}:
        seen = iter(["Executing", "Stopping", end])
        monkeypatch.setattr(executions, "describe", lambda aws, arn, seen=seen: ExecutionView(
            id="e1", arn=arn, pipeline="p", status=next(seen)))
        assert executions.wait(aws, EXECUTION.format("e1"), lambda view: None, poll_seconds=0).status == end
