"""infra/template.yaml grants each role what the pipeline needs and nothing beyond.

The template is resolved here (a small resolver of Ref / Sub / GetAtt / If / Join / Split for this template), then
compared with the boto3 calls of the deploy Lambda's modules
(read with ast), and the steps of the shipped definition (tests/golden/definition.json).
"""

from __future__ import annotations

import ast
import fnmatch
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.config import load_config
from pipeline.sagemaker.bootstrap import stack_parameters

ROOT = Path(__file__).resolve().parent.parent
ACCOUNT, REGION = "123456789012", "us-east-1"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/trainium-bert-bootstrap-ExecutionRole-ABC"
KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
BUCKET = f"trainium-bert-{ACCOUNT}-{REGION}"
TOPIC = f"arn:aws:sns:{REGION}:{ACCOUNT}:trainium-bert-alerts"
# The only "*" resources: actions that have no resource type in IAM.
STAR_ACTIONS = {"ecr:GetAuthorizationToken", "cloudwatch:PutMetricData"}


class CfnLoader(yaml.SafeLoader):
    """YAML with CloudFormation's short-form tags, as their long forms."""


def _tag(name: str):
    def construct(loader: yaml.Loader, node: yaml.Node) -> dict:
        if isinstance(node, yaml.ScalarNode):
            value: Any = loader.construct_scalar(node)
            if name == "Fn::GetAtt":
                value = value.split(".", 1)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_mapping(node, deep=True)
        return {name: value}

    return construct


for _short in ("Ref", "Sub", "GetAtt", "If", "Join", "Split", "Equals", "Select", "Not"):
    CfnLoader.add_constructor(f"!{_short}", _tag(_short if _short == "Ref" else f"Fn::{_short}"))

TEMPLATE = yaml.load((ROOT / "infra" / "template.yaml").read_text(), Loader=CfnLoader)
NO_VALUE = object()


def resolve(node: Any, params: dict[str, str], conditions: dict[str, bool]) -> Any:
    pseudo = {"AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::Partition": "aws", "AWS::NoValue": NO_VALUE}
    attrs = {"ExecutionRole.Arn": ROLE, "KmsKey.Arn": KEY, "Bucket.Arn": f"arn:aws:s3:::{BUCKET}"}
    refs = {**params, **pseudo, "Bucket": BUCKET, "ExecutionRole": ROLE.rsplit("/", 1)[1],
            "DeployLambdaRole": "trainium-bert-bootstrap-DeployLambdaRole-XYZ", "AlertsTopic": TOPIC}

    def sub(text: str, extra: dict) -> str:
        return re.sub(r"\$\{([^}]+)\}", lambda m: str({**refs, **attrs, **extra}[m.group(1)]), text)

    if isinstance(node, list):
        return [v for v in (resolve(x, params, conditions) for x in node) if v is not NO_VALUE]
    if not isinstance(node, dict):
        return node
    if set(node) == {"Ref"}:
        return refs[node["Ref"]]
    if set(node) == {"Fn::GetAtt"}:
        return attrs[".".join(node["Fn::GetAtt"])]
    if set(node) == {"Fn::Sub"}:
        value = node["Fn::Sub"]
        if isinstance(value, str):
            return sub(value, {})
        return sub(value[0], {k: resolve(v, params, conditions) for k, v in value[1].items()})
    if set(node) == {"Fn::If"}:
        name, yes, no = node["Fn::If"]
        return resolve(yes if conditions[name] else no, params, conditions)
    if set(node) == {"Fn::Join"}:
        return node["Fn::Join"][0].join(resolve(node["Fn::Join"][1], params, conditions))
    return {k: v for k, v in ((k, resolve(v, params, conditions)) for k, v in node.items()) if v is not NO_VALUE}


def cfg(**sets: str):
    return load_config(ROOT / "pipeline.yaml", [f"aws.role_arn={ROLE}", f"aws.bucket={BUCKET}",
                                                *(f"{k}={v}" for k, v in sets.items())],
                       environ={})


def rendered(kms: bool = False, config=None) -> dict[str, Any]:
    """The template's resources with the parameters bootstrap passes for `config` (default: pipeline.yaml)."""
    params = stack_parameters(config or cfg(), bucket="", kms=kms)
    declared = set(TEMPLATE["Parameters"])
    assert set(params) == declared, "bootstrap must pass every template parameter (the unchanged check needs it)"
    creates = params["CreateTrackingServer"] == "true"
    conditions = {"CreateKmsKey": kms, "DefaultBucketName": params["BucketName"] == "",
                  "HasAlertEmail": params["AlertEmail"] != "",
                  "CreatesTrackingServer": creates,
                  "HasTrackingServer": creates or params["TrackingServerResource"] != ""}
    return {name: resolve(res, params, conditions) for name, res in TEMPLATE["Resources"].items()
            if "Condition" not in res or conditions[res["Condition"]]}


def listed(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def statements(document: dict) -> list[dict]:
    return [{**s, "Action": listed(s["Action"]), "Resource": listed(s["Resource"])} for s in document["Statement"]]


def inline(resources: dict, role: str) -> dict:
    (policy,) = resources[role]["Properties"]["Policies"]
    return policy["PolicyDocument"]


def actions(document: dict) -> set[str]:
    return {a for s in statements(document) for a in s["Action"]}


# The clients of the deploy Lambda's modules, by the names the code gives them, and their IAM service prefix.
CLIENTS = {"sm": "sagemaker", "aas": "application-autoscaling", "s3": "s3", "sns": "sns", "client": "sagemaker"}
# Grants beyond the calls: what a call needs besides its own action.
IMPLIED = {
    "iam:PassRole",  # CreateModel with ExecutionRoleArn
    "cloudwatch:DescribeAlarms",  # UpdateEndpoint with an AutoRollbackConfiguration (GUARDRAILS_ALARM)
    "logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents",  # the function's own log group
    # RegisterScalableTarget / PutScalingPolicy: what Application Auto Scaling checks the caller may do to the variant,
    # the target tracking alarms it makes, and its service-linked role (made on first use in an account)
    "sagemaker:UpdateEndpointWeightsAndCapacities", "cloudwatch:PutMetricAlarm", "cloudwatch:DeleteAlarms",
    "iam:CreateServiceLinkedRole",
}


def _lambda_calls() -> set[str]:
    """The IAM actions of every boto3 call in the zip's modules: `sm.X(...)`, `self.sm.X`, `aas.X`, `self.s3.X`,
    `self.sns.X`, the runtime `client.invoke_endpoint`, and the operations named to get_paginator."""
    from pipeline.code import bundles

    found = set()  # tracking.py speaks MLflow's REST API, no boto3 client: its actions are checked in test_tracking
    for module in (m for m in bundles()["deploy"].files if m.endswith(".py") and not m.endswith("/tracking.py")):
        for node in ast.walk(ast.parse((ROOT / module).read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else (
                owner.attr if isinstance(owner, ast.Attribute) and isinstance(owner.value, ast.Name)
                and owner.value.id == "self" else None)
            if name in CLIENTS and node.attr not in ("exceptions",):
                found.add((CLIENTS[name], node.attr))
        for node in ast.walk(ast.parse((ROOT / module).read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get_paginator":
                found.add(("sagemaker", node.args[0].value))
    return {iam_action(service, method) for service, method in found if method != "get_paginator"}


def iam_action(service: str, method: str) -> str:
    return f"{service}:{''.join(part.title() for part in method.split('_'))}"


def test_deploy_lambda_role_grants_exactly_what_its_code_calls():
    calls = _lambda_calls()
    assert {"sagemaker:DescribeModelPackage", "sagemaker:CreateModel", "sagemaker:CreateEndpoint",
            "sagemaker:UpdateEndpoint", "sagemaker:UpdateModelPackage", "sagemaker:ListModelPackages",
            "sagemaker:InvokeEndpoint", "application-autoscaling:RegisterScalableTarget",
            "application-autoscaling:PutScalingPolicy", "s3:GetObject", "sns:Publish"} <= calls
    document = inline(rendered(), "DeployLambdaRole")
    assert actions(document) == calls | IMPLIED
    for s in statements(document):
        assert not any(a.endswith("*") for a in s["Action"])
        if "*" in s["Resource"]:  # IAM has no resource type for it
            assert s["Action"] == ["sagemaker:ListModelPackages"], s
    sm = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}"
    staging, production = f"{sm}:endpoint/trainium-bert-staging", f"{sm}:endpoint/trainium-bert"
    assert _allowed(document, "sagemaker:InvokeEndpoint", staging)
    assert _allowed(document, "sagemaker:InvokeEndpoint", production)  # champion/challenger sends it the sample
    assert not _allowed(document, "sagemaker:InvokeEndpoint", f"{sm}:endpoint/another")
    for endpoint in (staging, production):
        assert _allowed(document, "sagemaker:UpdateEndpoint", endpoint)
    assert not _allowed(document, "sagemaker:UpdateEndpoint", f"{sm}:endpoint/someone-elses")
    sample = f"arn:aws:s3:::{BUCKET}/trainium-bert/executions/abc123/evaluation/endpoint_sample.jsonl"
    assert _allowed(document, "s3:GetObject", sample)
    assert _allowed(document, "s3:GetObject", sample.replace("endpoint_sample.jsonl", "evaluation.json"))  # p50
    assert not _allowed(document, "s3:GetObject", f"arn:aws:s3:::{BUCKET}/trainium-bert/executions/abc123/x.csv")
    marker = f"arn:aws:s3:::{BUCKET}/trainium-bert/lifecycle-markers/events/0123abcd"
    assert all(_allowed(document, f"s3:{action}", marker) for action in ("PutObject", "GetObject", "DeleteObject"))
    assert not _allowed(document, "s3:PutObject", f"arn:aws:s3:::{BUCKET}/trainium-bert/executions/abc123/x.csv")
    by_sid = {s.get("Sid"): s for s in statements(document)}
    assert _allowed(document, "sns:Publish", TOPIC) and by_sid["Alerts"]["Resource"] == [TOPIC]
    (scaling,) = [s for s in statements(document) if "application-autoscaling:PutScalingPolicy" in s["Action"]]
    assert scaling["Condition"]["StringEquals"]["application-autoscaling:service-namespace"] == "sagemaker"


def test_target_tracking_alarms_are_allowed_under_the_endpoint_name():
    """Application Auto Scaling names them TargetTracking-<ResourceId>-AlarmHigh-<uuid>, with the ResourceId as
    registered (endpoint/<EndpointName>/variant/AllTraffic), in the name's own case: bootstrap takes lowercase
    endpoint names only (IAM matches SageMaker's lowercased ARNs case-sensitively), so both spellings agree."""
    from pipeline.sagemaker.stacks import StackError

    printed = inline(rendered(), "DeployLambdaRole")
    alarm = (f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:TargetTracking-endpoint/trainium-bert/variant/AllTraffic-"
             "AlarmHigh-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
    assert _allowed(printed, "cloudwatch:PutMetricAlarm", alarm)
    assert not _allowed(printed, "cloudwatch:PutMetricAlarm", alarm.replace("trainium-bert", "someone-elses"))
    with pytest.raises(StackError, match="expected lowercase"):
        rendered(config=cfg(**{"deploy.endpoint_name": "Trainium-Bert"}))


def test_deploy_lambda_reads_the_sample_and_writes_its_markers_through_the_kms_key():
    (policy,) = [r for r in rendered(kms=True).values() if r["Type"] == "AWS::IAM::Policy"
                 and r["Properties"]["PolicyName"] == "deploy-lambda-kms"]
    (use,) = statements(policy["Properties"]["PolicyDocument"])
    assert use["Action"] == ["kms:Decrypt", "kms:GenerateDataKey"] and use["Resource"] == [KEY]


def test_alerts_topic_lets_only_this_pipelines_rules_publish():
    resources = rendered()
    topic = resources["AlertsTopic"]["Properties"]
    assert topic["TopicName"] == "trainium-bert-alerts" and "Subscription" not in topic  # no alerts.email
    with_email = rendered(config=cfg(**{"alerts.email": "ops@example.com"}))["AlertsTopic"]["Properties"]
    assert with_email["Subscription"] == [{"Protocol": "email", "Endpoint": "ops@example.com"}]
    (publish,) = statements(resources["AlertsTopicPolicy"]["Properties"]["PolicyDocument"])
    assert publish["Principal"] == {"Service": "events.amazonaws.com"} and publish["Action"] == ["sns:Publish"]
    assert publish["Resource"] == [TOPIC]
    rule = f"arn:aws:events:{REGION}:{ACCOUNT}:rule/trainium-bert-execution-alerts"
    assert publish["Condition"] == {"ArnLike": {"aws:SourceArn": rule}}


@pytest.mark.parametrize("length", [20, 47, 48, 60, 183])
def test_the_topic_lets_the_execution_alerts_rule_publish_whatever_the_pipeline_names_length(length):
    """EventBridge publishes to SNS only where the topic policy allows the rule's ARN: the rule triggers apply
    puts, whose name is shortened with a hash past 64 characters (pipeline names over 47)."""
    from pipeline.sagemaker.triggers import rule_names

    name = ("p" + "-long" * 60)[:length].rstrip("-")
    config = cfg(**{"pipeline.name": name})
    params = stack_parameters(config, bucket="my-bucket", kms=False)
    policy = resolve(TEMPLATE["Resources"]["AlertsTopicPolicy"], params, {})
    (publish,) = statements(policy["Properties"]["PolicyDocument"])
    (alerts,) = [r for r in plan_rules(config) if r["Targets"][0]["Id"] == "alerts-topic"]
    assert alerts["Name"] == rule_names(config)["execution-alerts"] and len(alerts["Name"]) <= 64
    arn = f"arn:aws:events:{REGION}:{ACCOUNT}:rule/{alerts['Name']}"
    assert fnmatch.fnmatchcase(arn, publish["Condition"]["ArnLike"]["aws:SourceArn"])
    assert re.fullmatch(r"[.\-_A-Za-z0-9]{1,64}", params["AlertsRuleName"])  # the parameter's AllowedPattern


def plan_rules(config) -> list[dict]:
    from pipeline.sagemaker.triggers import plan

    return plan(config.model_copy(update={"alerts": config.alerts.model_copy(update={"topic_arn": TOPIC})}))


def test_events_role_may_only_start_this_pipeline():
    config = cfg()
    (start,) = statements(inline(rendered(config=config), "EventsRole"))
    assert start["Action"] == ["sagemaker:StartPipelineExecution"] and start["Effect"] == "Allow"
    assert start["Resource"] == [config.pipeline_arn] and "Condition" not in start


def _steps(steps: list[dict]):
    for step in steps:
        yield step
        arguments = step.get("Arguments", {})
        if isinstance(arguments, dict):
            yield from _steps(arguments.get("IfSteps", []) + arguments.get("ElseSteps", []))


def _strings(node: Any):
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


# What the pipeline service does with the execution role, per step type of the definition.
SERVICE_ACTIONS = {
    "Processing": {"sagemaker:CreateProcessingJob", "sagemaker:DescribeProcessingJob", "sagemaker:StopProcessingJob",
                   "iam:PassRole"},
    "Training": {"sagemaker:CreateTrainingJob", "sagemaker:DescribeTrainingJob", "sagemaker:StopTrainingJob",
                 "iam:PassRole"},
    "RegisterModel": {"sagemaker:CreateModelPackage", "sagemaker:DescribeModelPackage",
                      "sagemaker:DescribeModelPackageGroup"},
    "Lambda": {"lambda:InvokeFunction"},
    "Condition": set(),
    "Fail": set(),
}
# What the jobs, and the endpoint's model, do with it: read and write the prefix, pull images, log, emit metrics.
RUNTIME_ACTIONS = {
    "s3:ListBucket", "s3:GetBucketLocation", "s3:GetObject", "s3:PutObject",
    "ecr:GetAuthorizationToken", "ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer",
    "logs:CreateLogGroup", "logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents",
    "cloudwatch:PutMetricData",
    # the endpoints' models run as this role: the deployment guardrails docs ("Auto-Rollback Configuration and
    # Monitoring") ask it for cloudwatch:DescribeAlarms on the auto-rollback alarms (deploy.guardrails_alarm)
    "cloudwatch:DescribeAlarms",
}
KMS_ACTIONS = {"kms:CreateGrant", "kms:Decrypt", "kms:DescribeKey", "kms:Encrypt", "kms:GenerateDataKey"}


def _allowed(document: dict, action: str, resource: str) -> bool:
    return any(
        action in s["Action"] and any(fnmatch.fnmatchcase(resource, r) for r in s["Resource"])
        for s in statements(document)
    )


@pytest.mark.parametrize("kms", [False, True])
def test_execution_role_grants_what_the_steps_need_and_nothing_beyond(kms):
    golden = json.loads((ROOT / "tests" / "golden" / "definition.json").read_text())
    steps = list(_steps(golden["Steps"]))
    needed = set(RUNTIME_ACTIONS) | (KMS_ACTIONS if kms else set())
    for step in steps:
        needed |= SERVICE_ACTIONS[step["Type"]]
        if step.get("Arguments", {}).get("Tags"):
            needed.add("sagemaker:AddTags")
    resources = rendered(kms)
    execution_role = [ROLE.rsplit("/", 1)[1]]
    attached = [r["Properties"] for r in resources.values()
                if r["Type"] == "AWS::IAM::Policy" and r["Properties"]["Roles"] == execution_role]
    assert not resources["ExecutionRole"]["Properties"].get("Policies")
    document = {"Statement": [s for p in attached for s in p["PolicyDocument"]["Statement"]]}
    assert actions(document) == needed

    sm = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}"
    job = {"Processing": "processing-job", "Training": "training-job"}
    for step in steps:
        if step["Type"] in job:
            arn = f"{sm}:{job[step['Type']]}/pipelines-abc123-{step['Name'].lower()}-xyz"
            for verb in ("Create", "Describe", "Stop"):
                assert _allowed(document, f"sagemaker:{verb}{step['Type']}Job", arn)
            assert _allowed(document, "sagemaker:AddTags", arn)
    assert not _allowed(document, "sagemaker:CreateTrainingJob", f"{sm}:training-job/someone-elses-job")
    function = next(s for s in steps if s["Type"] == "Lambda")["FunctionArn"]
    assert _allowed(document, "lambda:InvokeFunction", function)
    group = cfg().pipeline.model_package_group
    assert _allowed(document, "sagemaker:CreateModelPackage", f"{sm}:model-package/{group}/3")
    assert _allowed(document, "iam:PassRole", ROLE)
    (passing,) = [s for s in statements(document) if "iam:PassRole" in s["Action"]]
    assert passing["Resource"] == [ROLE]
    assert passing["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}}

    # S3: the bucket (listing) and the objects under aws.prefix only; every S3 URI of the definition is inside it.
    s3_resources = {r for s in statements(document) for r in s["Resource"] if r.startswith("arn:aws:s3:::")}
    assert s3_resources == {f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/trainium-bert/*"}
    for uri in (u for u in _strings(golden) if u.startswith("s3://my-sagemaker-bucket/")):
        key = uri.removeprefix("s3://my-sagemaker-bucket/")
        obj = f"arn:aws:s3:::{BUCKET}/{key.rstrip('/')}/x"  # an object at or under the URI (also a Join's head)
        assert _allowed(document, "s3:GetObject", obj) and _allowed(document, "s3:PutObject", obj), uri

    # ECR: exactly the repositories of the configured images, in the registry and region they name.
    config = cfg()
    repos = {
        re.match(r"^(\d+)\.dkr\.ecr\.([a-z0-9-]+)\.amazonaws\.com/([^:]+):", config.image(kind)).groups()
        for kind in ("training", "processing", "inference", "evaluation", "training_cuda", "inference_gpu",
                 "inference_neuron")
    }
    pull = [s for s in statements(document) if "ecr:BatchGetImage" in s["Action"]]
    granted = {r for s in pull for r in s["Resource"]}
    assert granted == {f"arn:aws:ecr:{region}:{account}:repository/{repo}" for account, region, repo in repos}

    # "*" only where IAM has no resource type, and metrics only in SageMaker's namespaces.
    for s in statements(document):
        assert not any(a.endswith("*") for a in s["Action"])
        if "*" in s["Resource"]:
            assert set(s["Action"]) <= STAR_ACTIONS, s
            if "cloudwatch:PutMetricData" in s["Action"]:
                assert s["Condition"] == {"StringLike": {"cloudwatch:namespace": "/aws/sagemaker/*"}}
    alarm = f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:{config.deploy.guardrails_alarm or 'trainium-bert-5xx'}"
    assert _allowed(document, "cloudwatch:DescribeAlarms", alarm)
    kms_statements = [s for s in statements(document) if set(s["Action"]) & KMS_ACTIONS]
    assert [s["Resource"] for s in kms_statements] == ([[KEY]] if kms else [])


def test_the_execution_role_pulls_each_image_from_its_own_registry():
    """A TorchNeuron image built in your own ECR beside the DLCs (backend native): bootstrap refused two registries."""
    own = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/bert-torchneuron:2.13"
    config = cfg(**{"training.backend": "native", "training.instance_type": "ml.trn2.48xlarge",
                    "images.training": own})
    resources = rendered(config=config)
    pulls = [s for r in resources.values() if r["Type"] == "AWS::IAM::Policy"
             for s in statements(r["Properties"]["PolicyDocument"]) if "ecr:BatchGetImage" in s["Action"]]
    granted = {r for s in pulls for r in s["Resource"]}
    assert f"arn:aws:ecr:{REGION}:{ACCOUNT}:repository/bert-torchneuron" in granted
    assert f"arn:aws:ecr:{REGION}:763104351884:repository/huggingface-pytorch-inference" in granted
    assert not any(r.endswith("/pytorch-training-neuronx") for r in granted)


def test_bucket_is_private_encrypted_versioned_and_tls_only():
    for kms in (False, True):
        resources = rendered(kms)
        bucket = resources["Bucket"]["Properties"]
        (rule,) = bucket["BucketEncryption"]["ServerSideEncryptionConfiguration"]
        assert rule["ServerSideEncryptionByDefault"] == (
            {"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": KEY} if kms else {"SSEAlgorithm": "AES256"}
        )
        assert ("KmsKey" in resources) == kms
    assert bucket["VersioningConfiguration"] == {"Status": "Enabled"}
    assert set(bucket["PublicAccessBlockConfiguration"].values()) == {True}
    assert resources["KmsKey"]["Properties"]["EnableKeyRotation"] is True
    (deny,) = statements(resources["BucketPolicy"]["Properties"]["PolicyDocument"])
    assert deny["Effect"] == "Deny" and deny["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    assert deny["Resource"] == [f"arn:aws:s3:::{BUCKET}", f"arn:aws:s3:::{BUCKET}/*"]
    rules = {r["Id"]: r for r in bucket["LifecycleConfiguration"]["Rules"]}
    assert rules["ExpireCheckpoints"]["Prefix"] == "trainium-bert/checkpoints/"
    assert rules["ExpireNoncurrentVersions"]["NoncurrentVersionExpiration"] == {"NoncurrentDays": "30"}


def test_the_outputs_name_config_keys_that_exist():
    from pipeline.sagemaker.bootstrap import OUTPUT_KEYS

    assert set(TEMPLATE["Outputs"]) == set(OUTPUT_KEYS)
    for output, key in OUTPUT_KEYS.items():
        assert TEMPLATE["Outputs"][output]["Description"] == key
        section, name = key.split(".")
        assert name in type(getattr(cfg(), section)).model_fields, key


@pytest.mark.parametrize("region, partition", [("us-east-1", "aws"), ("us-gov-west-1", "aws-us-gov"),
                                               ("cn-north-1", "aws-cn")])
def test_every_arn_and_policy_is_in_the_partition_of_the_region(region, partition):
    """botocore's endpoint data (endpoints.json) maps a region to its partition, as ${AWS::Partition} does in the
    template: an arn:aws ARN in GovCloud or China names nothing there."""
    import botocore.session

    assert botocore.session.get_session().get_partition_for_region(region) == partition
    role = f"arn:{partition}:iam::{ACCOUNT}:role/trainium-bert-bootstrap-ExecutionRole-ABC"
    config = load_config(ROOT / "pipeline.yaml", [f"aws.region={region}", f"aws.role_arn={role}",
                                                  f"aws.bucket={BUCKET}", "aws.kms_key_id=1234abcd"], environ={})
    arns = [config.pipeline_arn, config.deploy_lambda_arn, config.aws.role_arn]
    assert all(arn.startswith(f"arn:{partition}:") for arn in arns), arns
    text = (ROOT / "infra" / "template.yaml").read_text()  # the one home of the IAM: its ARNs by ${AWS::Partition}
    assert "arn:aws:" not in text and text.count("arn:${AWS::Partition}:") > 15
    with pytest.raises(Exception, match=f"expected an ARN of partition {partition}"):
        load_config(ROOT / "pipeline.yaml", [f"aws.region={region}", f"aws.role_arn={ROLE.replace('aws', 'aws-x')}",
                                             f"aws.bucket={BUCKET}"], environ={})
