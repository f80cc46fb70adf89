"""The generated DAG: its real content, its references, determinism, and no network while building it.

Regenerate the golden file after an intended change of the DAG with:
    python -m pipeline definition --out tests/golden/definition.json
"""

from __future__ import annotations

import inspect
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.code import CodeBundle
from pipeline.config import ConfigError, load_config
from pipeline.dag.graph import flatten_steps
from pipeline.definition import definition, step_arguments

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).resolve().parent / "golden" / "definition.json"
# the execution variables the SDK writes (sagemaker.core.workflow.execution_variables.ExecutionVariables)
EXECUTION_VARIABLES = {"PipelineExecutionId", "PipelineExecutionArn", "PipelineName", "PipelineArn", "StartDateTime",
                       "CurrentDateTime", "TrainingJobName", "ProcessingJobName"}


@pytest.fixture(scope="module")
def text(no_network_module):
    return definition(load_config(ROOT / "pipeline.yaml", environ={}))


@pytest.fixture(scope="module")
def dag(text):
    return json.loads(text)


@pytest.fixture(scope="module")
def steps(dag):
    return flatten_steps(dag["Steps"])


def without_code_hashes(text: str) -> str:
    """The definition with content hashes of the step code, and the checkpoint folder's digest (which holds the code's
    hash), replaced, so the golden file tracks the DAG only."""
    return re.sub(r'"[0-9a-f]{16}"', '"<digest>"', re.sub(r"[0-9a-f]{64}", "<sha256>", text))


def references(node, found=None):
    found = [] if found is None else found
    if isinstance(node, dict):
        if set(node) == {"Get"}:
            found.append(node["Get"])
        for value in node.values():
            references(value, found)
    elif isinstance(node, list):
        for value in node:
            references(value, found)
    return found


def test_matches_the_golden_file(text):
    assert without_code_hashes(text) == without_code_hashes(GOLDEN.read_text()), (
        "the DAG changed: if intended, regenerate with python -m pipeline definition --out tests/golden/definition.json"
    )


def test_is_byte_identical_for_the_same_config(text):
    assert definition(load_config(ROOT / "pipeline.yaml", environ={})) == text


def test_steps_types_and_wiring(dag, steps):
    assert [s["Name"] for s in dag["Steps"]] == [
        "Tokenize", "Train", "Evaluate", "AccuracyGate", "ApprovedGate"
    ]
    assert {n: s["Type"] for n, s in steps.items()} == {
        "Tokenize": "Processing",
        "Train": "Training",
        "Evaluate": "Processing",
        "AccuracyGate": "Condition",
        "RegisterModel": "RegisterModel",
        "ApprovedGate": "Condition",
        "Deploy": "Lambda",
        "AccuracyTooLow": "Fail",
    }
    gate = steps["AccuracyGate"]["Arguments"]
    assert [s["Name"] for s in gate["IfSteps"]] == ["RegisterModel"]
    assert steps["ApprovedGate"]["DependsOn"] == ["RegisterModel"]  # not nested: no condition inside a condition
    assert [s["Name"] for s in gate["ElseSteps"]] == ["AccuracyTooLow"]
    assert [s["Name"] for s in steps["ApprovedGate"]["Arguments"]["IfSteps"]] == ["Deploy"]
    assert steps["ApprovedGate"]["Arguments"]["ElseSteps"] == []
    # Data dependencies: Train reads Tokenize's outputs (it scores the test split too), Evaluate reads Train's model
    # (with its test predictions) and Tokenize's test split.
    train_channels = {
        c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"]
        for c in steps["Train"]["Arguments"]["InputDataConfig"]
    }
    assert train_channels == {
        **{split: {"Get": f"Steps.Tokenize.ProcessingOutputConfig.Outputs['{split}'].S3Output.S3Uri"}
           for split in ("train", "validation", "test")},
        "tracking": "s3://my-sagemaker-bucket/trainium-bert/tracking/",  # the tracking file, at a fixed key
    }
    evaluate_inputs = {
        i["InputName"]: i["S3Input"]["S3Uri"] for i in steps["Evaluate"]["Arguments"]["ProcessingInputs"]
    }
    assert evaluate_inputs["model"] == {"Get": "Steps.Train.ModelArtifacts.S3ModelArtifacts"}
    assert evaluate_inputs["test"] == {"Get": "Steps.Tokenize.ProcessingOutputConfig.Outputs['test'].S3Output.S3Uri"}


def test_parameters(dag):
    declared = {p["Name"]: (p["Type"], p["DefaultValue"]) for p in dag["Parameters"]}
    assert declared == {
        "InputData": ("String", "fancyzhx/amazon_polarity"),
        "TrainInstanceType": ("String", "ml.trn1.32xlarge"),
        "TrainInstanceCount": ("Integer", 1),
        "Epochs": ("Integer", 2),
        "LearningRate": ("Float", 5e-05),
        "BatchSize": ("Integer", 16),
        "MaxLength": ("Integer", 128),
        "AccuracyThreshold": ("Float", 0.85),
        "ModelApprovalStatus": ("String", "PendingManualApproval"),
    }  # no EndpointName: the deploy Lambda's role may act on the configured endpoints only (issue 19 item 6)


def test_no_experiment_or_trial_per_execution(dag):
    """The SDK's default PipelineExperimentConfig (in us-east-1 and other regions) makes SageMaker create an
    experiment and a trial per execution, which the execution role of infra/template.yaml may not do."""
    from sagemaker.mlops.workflow.pipeline import Pipeline

    assert inspect.signature(Pipeline).parameters["pipeline_experiment_config"].default is not None
    assert dag["PipelineExperimentConfig"] is None


def test_training_step_runs_torchrun_in_the_neuronx_container(steps):
    train = steps["Train"]
    args = train["Arguments"]
    assert "pytorch-training-neuronx" in args["AlgorithmSpecification"]["TrainingImage"]
    assert args["ResourceConfig"]["InstanceType"] == {"Get": "Parameters.TrainInstanceType"}
    assert args["ResourceConfig"]["InstanceCount"] == {"Get": "Parameters.TrainInstanceCount"}
    hps = args["HyperParameters"]
    assert "sagemaker_torch_distributed_enabled" not in hps  # launch.py starts torchrun through the toolkit's runner
    assert hps["sagemaker_program"] == '"launch.py"'
    assert re.fullmatch(
        r'"s3://my-sagemaker-bucket/trainium-bert/code/[0-9a-f]{64}/training/sourcedir.tar.gz"',
        hps["sagemaker_submit_directory"],
    )
    assert hps["epochs"] == {"Std:Join": {"On": "", "Values": [{"Get": "Parameters.Epochs"}]}}
    assert args["StoppingCondition"]["MaxRuntimeInSeconds"] == 86400
    # One checkpoint prefix per training the step cache tells apart, nothing per execution: CheckpointConfig is a
    # cache key attribute of a training step (an execution id there and Train is never a cache hit on AWS).
    checkpoints = args["CheckpointConfig"]["S3Uri"]["Std:Join"]
    assert checkpoints["On"] == "/" and checkpoints["Values"][0] == "s3://my-sagemaker-bucket/trainium-bert/checkpoints"
    assert re.fullmatch(r"[0-9a-f]{16}", checkpoints["Values"][1])
    assert checkpoints["Values"][2:] == [{"Get": "Steps.Tokenize.ProcessingJobName"}] + [
        {"Get": f"Parameters.{name}"} for name in ("BatchSize", "Epochs", "LearningRate", "MaxLength",
                                                   "TrainInstanceCount", "TrainInstanceType")]

    assert (
        args["Environment"]["NEURON_COMPILE_CACHE_URL"] == "s3://my-sagemaker-bucket/trainium-bert/neuron-compile-cache"
    )
    metrics = {m["Name"]: m["Regex"] for m in args["AlgorithmSpecification"]["MetricDefinitions"]}
    line = "step=200 epoch=0 loss=0.3125 samples_per_sec=812.5 lr=4.5e-05"
    assert re.search(metrics["train:loss"], line).group(1) == "0.3125"
    assert re.search(metrics["train:samples_per_sec"], line).group(1) == "812.5"
    assert re.search(metrics["train:learning_rate"], line).group(1) == "4.5e-05"
    assert train["CacheConfig"] == {"Enabled": True, "ExpireAfter": "P30D"}
    assert "SageMaker.CAPACITY_ERROR" in train["RetryPolicies"][0]["ExceptionType"]
    assert "EnableManagedSpotTraining" not in args


def test_processing_steps_run_the_step_scripts_from_hashed_code(steps):
    for name, package in (("Tokenize", "tokenize"), ("Evaluate", "evaluation")):
        app = steps[name]["Arguments"]["AppSpecification"]
        assert app["ContainerEntrypoint"] == ["python3", "/opt/ml/processing/input/code/steps/run.py", package]
        code = next(i for i in steps[name]["Arguments"]["ProcessingInputs"] if i["InputName"] == "code")
        assert re.fullmatch(
            rf"s3://my-sagemaker-bucket/trainium-bert/code/[0-9a-f]{{64}}/{package}/", code["S3Input"]["S3Uri"]
        )
        assert code["S3Input"]["LocalPath"] == "/opt/ml/processing/input/code"
    assert (ROOT / "steps" / "run.py").is_file()
    outputs = steps["Tokenize"]["Arguments"]["ProcessingOutputConfig"]["Outputs"]
    assert [o["OutputName"] for o in outputs] == ["train", "validation", "test", "stats"]
    assert outputs[0]["S3Output"]["S3Uri"]["Std:Join"]["Values"][2] == {"Get": "Execution.PipelineExecutionId"}
    args = steps["Tokenize"]["Arguments"]["AppSpecification"]["ContainerArguments"]
    assert args[args.index("--source") + 1] == {"Get": "Parameters.InputData"}


def test_accuracy_gate_compares_the_evaluation_report_with_the_threshold(steps):
    evaluate = steps["Evaluate"]
    assert evaluate["PropertyFiles"] == [
        {"FilePath": "evaluation.json", "OutputName": "evaluation", "PropertyFileName": "EvaluationReport"}
    ]
    (condition,) = steps["AccuracyGate"]["Arguments"]["Conditions"]
    assert condition["Type"] == "GreaterThanOrEqualTo"
    assert condition["LeftValue"] == {
        "Std:JsonGet": {
            "Path": "classification.accuracy.value",
            "PropertyFile": {"Get": "Steps.Evaluate.PropertyFiles.EvaluationReport"},
        }
    }
    assert condition["RightValue"] == {"Get": "Parameters.AccuracyThreshold"}
    message = steps["AccuracyTooLow"]["Arguments"]["ErrorMessage"]["Std:Join"]["Values"]
    assert condition["LeftValue"] in message and {"Get": "Parameters.AccuracyThreshold"} in message


def test_the_gate_can_take_macro_f1_and_says_so_when_it_fails():
    dag = json.loads(definition(load_config(ROOT / "pipeline.yaml", ["evaluation.gate_metric=macro_f1"], environ={})))
    found = flatten_steps(dag["Steps"])
    (condition,) = found["AccuracyGate"]["Arguments"]["Conditions"]
    assert condition["LeftValue"]["Std:JsonGet"]["Path"] == "classification.macro_f1.value"
    message = found["AccuracyTooLow"]["Arguments"]["ErrorMessage"]["Std:Join"]["Values"]
    assert message[:2] == ["Macro-F1", condition["LeftValue"]]
    with pytest.raises(ConfigError, match="evaluation.gate_metric"):
        load_config(ROOT / "pipeline.yaml", ["evaluation.gate_metric=f1"], environ={})


def test_beat_baseline_adds_a_condition_on_the_baselines_margin_and_says_so_when_it_fails():
    from pipeline.dag.expressions import Context, condition, evaluate

    dag = json.loads(definition(load_config(ROOT / "pipeline.yaml", ["evaluation.beat_baseline=true"], environ={})))
    found = flatten_steps(dag["Steps"])
    threshold, baseline = found["AccuracyGate"]["Arguments"]["Conditions"]
    assert baseline["LeftValue"]["Std:JsonGet"]["Path"] == "baseline.margin" and baseline["Type"] == "GreaterThan"
    inputs = {i["InputName"] for i in found["Evaluate"]["Arguments"]["ProcessingInputs"]}
    assert {"test", "train"} <= inputs  # the baseline fits on the train split
    for margin, passes in ((0.02, True), (0.0, False), (-0.1, False)):
        report = {"classification": {"accuracy": {"value": 0.9}}, "baseline": {"margin": margin}}
        ctx = Context(parameters={"AccuracyThreshold": 0.85}, execution={}, properties={},
                      property_files={("Evaluate", "EvaluationReport"): lambda r=report: r})
        assert all(condition(c, ctx, "gate") for c in (threshold, baseline)) is passes
    message = evaluate(found["AccuracyTooLow"]["Arguments"]["ErrorMessage"], ctx, "message")
    assert message == ("Accuracy 0.9 is below the threshold 0.85 or does not lead the TF-IDF baseline: its lead is "
                       "-0.1 - the model was not registered.")
    plain = flatten_steps(json.loads(definition(load_config(ROOT / "pipeline.yaml", ["evaluation.baseline_rows=0"],
                                                            environ={})))["Steps"])
    assert "train" not in {i["InputName"] for i in plain["Evaluate"]["Arguments"]["ProcessingInputs"]}
    with pytest.raises(ConfigError, match="evaluation.beat_baseline=true: expected evaluation.baseline_rows >= 1"):
        load_config(ROOT / "pipeline.yaml", ["evaluation.beat_baseline=true", "evaluation.baseline_rows=0"],
                    environ={})


def test_register_and_deploy(steps):
    register = steps["RegisterModel"]["Arguments"]
    assert register["ModelPackageGroupName"] == "trainium-bert"
    assert register["ModelApprovalStatus"] == {"Get": "Parameters.ModelApprovalStatus"}
    spec = register["InferenceSpecification"]
    assert spec["SupportedRealtimeInferenceInstanceTypes"] == ["ml.c5.xlarge"]
    assert spec["Containers"][0]["ModelDataUrl"] == {  # the serving artifact: the model and its chosen variant
        "Std:Join": {"On": "/", "Values": [
            {"Get": "Steps.Evaluate.ProcessingOutputConfig.Outputs['serving'].S3Output.S3Uri"}, "model.tar.gz"]}
    }
    assert "huggingface-pytorch-inference" in spec["Containers"][0]["Image"]
    environment = spec["Containers"][0]["Environment"]
    for variable, path in (("INFERENCE_QUANTIZE", "inference.quantize"), ("INFERENCE_RUNTIME", "inference.runtime")):
        assert environment[variable] == {  # the variant the evaluation chose on the test split
            "Std:JsonGet": {"Path": path, "PropertyFile": {"Get": "Steps.Evaluate.PropertyFiles.EvaluationReport"}}
        }
    assert environment["SAGEMAKER_MODEL_SERVER_WORKERS"] == "2" and environment["INFERENCE_MAX_TEXTS"] == "256"
    assert environment["SAGEMAKER_PROGRAM"] == "inference.py"
    arguments = steps["Evaluate"]["Arguments"]["AppSpecification"]["ContainerArguments"]
    assert arguments[arguments.index("--int8-tolerance") + 1] == "0.005" and "--int8" in arguments
    assert arguments[arguments.index("--sample-size") + 1] == "4000"
    assert arguments[arguments.index("--serving-dir") + 1] == "/opt/ml/processing/serving"
    assert arguments[arguments.index("--min-agreement") + 1] == "0.99"
    stats = register["ModelMetrics"]["ModelQuality"]["Statistics"]
    assert stats["S3Uri"]["Std:Join"]["Values"][-1] == "evaluation.json"
    (approved,) = steps["ApprovedGate"]["Arguments"]["Conditions"]
    assert approved == {
        "Type": "Equals",
        "LeftValue": {"Get": "Parameters.ModelApprovalStatus"},
        "RightValue": "Approved",
    }
    deploy = steps["Deploy"]
    assert deploy["FunctionArn"] == "arn:aws:lambda:us-east-1:123456789012:function:trainium-bert-deploy"
    assert deploy["Arguments"]["model_package_arn"] == {"Get": "Steps.RegisterModel.ModelPackageArn"}
    assert deploy["Arguments"] == {"model_package_arn": {"Get": "Steps.RegisterModel.ModelPackageArn"}}


def test_every_reference_points_to_a_parameter_an_execution_variable_or_a_step(dag, steps):
    parameters = {p["Name"] for p in dag["Parameters"]}
    refs = references(dag["Steps"])
    assert refs
    for ref in refs:
        kind, _, rest = ref.partition(".")
        if kind == "Parameters":
            assert rest in parameters, ref
        elif kind == "Execution":
            assert rest in EXECUTION_VARIABLES, ref
        else:
            assert kind == "Steps", ref
            step, _, prop = rest.partition(".")
            assert step in steps and prop, ref
            if prop.startswith("PropertyFiles."):
                declared = {f["PropertyFileName"] for f in steps[step].get("PropertyFiles", [])}
                assert prop.split(".")[1] in declared, ref
            if prop.startswith("ProcessingOutputConfig.Outputs['"):
                name = prop.split("'")[1]
                outputs = steps[step]["Arguments"]["ProcessingOutputConfig"]["Outputs"]
                assert name in [o["OutputName"] for o in outputs], ref


def test_spot_vpc_kms_and_s3_data_source():
    cfg = load_config(
        ROOT / "pipeline.yaml",
        [
            "training.spot.enabled=true",
            "aws.kms_key_id=alias/pipeline",
            "aws.vpc={subnets: [subnet-1], security_group_ids: [sg-1]}",
            "data.source=s3://data-bucket/polarity/",
        ],
        environ={},
    )
    steps = flatten_steps(json.loads(definition(cfg))["Steps"])
    train = steps["Train"]["Arguments"]
    assert train["EnableManagedSpotTraining"] is True
    assert train["StoppingCondition"]["MaxWaitTimeInSeconds"] == 172800
    assert train["VpcConfig"] == {"SecurityGroupIds": ["sg-1"], "Subnets": ["subnet-1"]}
    assert train["OutputDataConfig"]["KmsKeyId"] == "alias/pipeline"
    assert "VolumeKmsKeyId" not in train["ResourceConfig"]  # refused for instance types with local storage
    tokenize = steps["Tokenize"]["Arguments"]
    assert tokenize["NetworkConfig"]["VpcConfig"] == {"SecurityGroupIds": ["sg-1"], "Subnets": ["subnet-1"]}
    assert tokenize["ProcessingResources"]["ClusterConfig"]["VolumeKmsKeyId"] == "alias/pipeline"
    data = next(i for i in tokenize["ProcessingInputs"] if i["InputName"] == "data")
    assert data["S3Input"]["S3Uri"] == {"Get": "Parameters.InputData"}
    assert data["S3Input"]["LocalPath"] == "/opt/ml/processing/input/data"


def test_an_auto_learning_rate_tells_train_py_the_global_batch_it_is_set_for():
    auto = load_config(ROOT / "pipeline.yaml", ["training.instance_type=ml.p4d.24xlarge"], environ={})
    train = flatten_steps(json.loads(definition(auto))["Steps"])["Train"]["Arguments"]["HyperParameters"]
    assert (train["learning-rate"], train["lr-global-batch"]) == ({"Std:Join": {"On": "", "Values": [
        {"Get": "Parameters.LearningRate"}]}}, "512")  # the reference pair: train.py scales it to 8 x 256
    parameters = {p["Name"]: p for p in json.loads(definition(auto))["Parameters"]}
    assert parameters["LearningRate"]["DefaultValue"] == 5e-5
    by_hand = load_config(ROOT / "pipeline.yaml", ["training.learning_rate=3e-5"], environ={})
    train = flatten_steps(json.loads(definition(by_hand))["Steps"])["Train"]["Arguments"]["HyperParameters"]
    assert train["lr-global-batch"] == "0"


def test_code_hash_follows_content_only(tmp_path):
    folder = tmp_path / "training"
    folder.mkdir()
    (folder / "train.py").write_text("print('a')\n")
    first = CodeBundle("training", folder, (folder,), packed=True)
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    again = CodeBundle("training", folder, (folder,), packed=True)
    assert again.sha256 == first.sha256 and again.tarball() == first.tarball()
    (folder / "train.py").write_text("print('b')\n")
    changed = CodeBundle("training", folder, (folder,), packed=True)
    assert changed.sha256 != first.sha256
    assert changed.uri("s3://b/p") == f"s3://b/p/code/{changed.sha256}/training/sourcedir.tar.gz"


def test_hidden_and_git_ignored_files_are_not_code(tmp_path):
    """A .DS_Store, an editor's .swp or a build/ folder that git ignores must not change the bundle: the same commit
    gives the same definition on every machine. A new file git does not ignore is code."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("build/\n")
    folder = tmp_path / "training"
    folder.mkdir()
    (folder / "train.py").write_text("print('a')\n")
    first = CodeBundle("training", tmp_path, (folder,), packed=True)
    (folder / ".DS_Store").write_bytes(b"\0\1")
    (folder / ".train.py.swp").write_bytes(b"\0")
    (folder / "build" / "lib").mkdir(parents=True)
    (folder / "build" / "lib" / "train.py").write_text("print('old')\n")
    again = CodeBundle("training", tmp_path, (folder,), packed=True)
    assert list(again.files) == ["training/train.py"] and again.sha256 == first.sha256
    (folder / "helpers.py").write_text("X = 1\n")  # untracked, not ignored: part of the code
    assert list(CodeBundle("training", tmp_path, (folder,), packed=True).files) == ["training/helpers.py",
                                                                                     "training/train.py"]


@pytest.fixture(scope="module")
def project_copy(tmp_path_factory) -> Path:
    """A copy of the code the definition hashes (steps/, training/), to edit."""
    root = tmp_path_factory.mktemp("project")
    for folder in ("steps", "training"):
        shutil.copytree(ROOT / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.mark.parametrize(("edited", "changed"), [
    ("steps/tokenize/readers.py", {"Tokenize"}),
    ("steps/evaluation/quality.py", {"Evaluate"}),
    ("steps/deploy/handler.py", set()),  # the Lambda's code is in no job: nothing re-runs
    ("steps/deploy/lifecycle.py", set()),
    ("steps/run.py", {"Tokenize", "Evaluate"}),  # the processing steps' entry point
    ("training/train.py", {"Train", "AccuracyGate", "RegisterModel"}),  # the version records its hash
])
def test_an_edit_changes_the_code_location_of_its_own_step_only(text, project_copy, monkeypatch, edited, changed):
    """SageMaker's cache key of a step holds its code location: an edit to one deployable must re-run its step alone
    (and what reads its outputs), never a step of another deployable."""
    path = project_copy / edited
    original = path.read_text()
    path.write_text(original + "# edited\n")
    try:
        monkeypatch.setattr("pipeline.code.PROJECT_ROOT", project_copy)
        edited_text = definition(load_config(ROOT / "pipeline.yaml", environ={}))
    finally:
        path.write_text(original)
    before, after = (flatten_steps(json.loads(t)["Steps"]) for t in (text, edited_text))
    assert {name for name in before if before[name] != after[name]} == changed
    assert (edited_text == text) is not changed  # a Lambda edit leaves the definition byte-identical


def published_images() -> dict[str, str]:
    lines = (Path(__file__).parent / "images" / "published.txt").read_text().splitlines()
    return dict(line.split(" | ", 1) for line in lines if line and not line.startswith("#"))


def test_every_default_image_is_a_published_deep_learning_container():
    cfg = load_config(ROOT / "pipeline.yaml", environ={})
    published = published_images()
    for kind in ("training", "processing", "inference", "evaluation", "training_cuda", "inference_gpu",
                 "inference_neuron"):
        uri = cfg.image(kind)
        registry, _, tag = uri.partition("/")
        assert registry == "763104351884.dkr.ecr.us-east-1.amazonaws.com", uri
        assert tag in published, f"images.{kind}: {tag} is not in tests/images/published.txt"
    assert "pytorch-training:2.8.0-cpu-py312-ubuntu22.04" not in published  # the unpublished former default


def test_evaluate_runs_on_the_serving_image(steps):
    """The variant is chosen with the transformers and torch that serve the model; Tokenize shares that image (its
    packages take datasets unchanged: tests/test_images.py)."""
    evaluate = steps["Evaluate"]["Arguments"]["AppSpecification"]["ImageUri"]
    assert evaluate == steps["RegisterModel"]["Arguments"]["InferenceSpecification"]["Containers"][0]["Image"]
    assert steps["Tokenize"]["Arguments"]["AppSpecification"]["ImageUri"] == evaluate


def test_multi_node_training_request_carries_the_neuron_and_efa_environment(tmp_path):
    """The generated request, then what train.py adds to it on a two-node trn1n job."""
    import importlib.util

    cfg = load_config(
        ROOT / "pipeline.yaml", ["training.instance_count=2", "training.instance_type=ml.trn1n.32xlarge"], environ={}
    )
    dag = json.loads(definition(cfg))
    args = flatten_steps(dag["Steps"])["Train"]["Arguments"]
    count = next(p for p in dag["Parameters"] if p["Name"] == "TrainInstanceCount")
    assert count["DefaultValue"] == 2
    assert args["ResourceConfig"]["InstanceCount"] == {"Get": "Parameters.TrainInstanceCount"}
    environment = args["Environment"]
    assert environment["MALLOC_ARENA_MAX"] == "64"  # read by glibc at process start: must come from the job
    assert environment["FI_EFA_FORK_SAFE"] == "1" and "FI_EFA_USE_DEVICE_RDMA" not in environment  # not forced
    spec = importlib.util.spec_from_file_location("train_env", ROOT / "training" / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    job = {**environment, "SM_HOSTS": '["algo-1", "algo-2"]', "SM_CURRENT_INSTANCE_TYPE": "ml.trn1n.32xlarge"}
    added = train.neuron_environment(job, tmp_path)
    assert added["FI_PROVIDER"] == "efa" and added["FI_EFA_USE_DEVICE_RDMA"] == "1"  # the toolkit: trn1.32xlarge
    flags = added["NEURON_CC_FLAGS"].split()
    assert {"--model-type=transformer", "--auto-cast=none"} <= set(flags)
    assert f"--cache_dir={environment['NEURON_COMPILE_CACHE_URL']}" in flags


def test_the_train_job_compiles_ahead_itself_and_no_other_job_does(steps, no_network_module):
    """No separate compile job: Train's launch.py compiles what the cache lacks (compile-ahead), on XLA only, and
    its switch is in Train's hyperparameters (the cache key), not in train.py's command line."""
    assert [s for s in steps.values() if s["Type"] == "Training"] == [steps["Train"]]
    train = steps["Train"]["Arguments"]
    assert train["HyperParameters"]["compile-ahead"] == "true"
    assert "RUN_NEURON_PARALLEL_COMPILE" not in train["Environment"]  # launch.py sets it for its compile pass only
    cfg = load_config(ROOT / "pipeline.yaml", environ={})
    assert "--compile-ahead" not in step_arguments(cfg, "Train")
    native = ["training.backend=native", "images.training=123456789012.dkr.ecr.us-east-1.amazonaws.com/torchneuron:1"]
    for off in (["training.compile_ahead=false"], native):
        overrides = [*off, "training.instance_type=ml.trn2.48xlarge"]
        dag = json.loads(definition(load_config(ROOT / "pipeline.yaml", overrides, environ={})))
        (train,) = [s for s in dag["Steps"] if s["Name"] == "Train"]
        assert train["Arguments"]["HyperParameters"]["compile-ahead"] == "false", off


def test_a_vpc_without_internet_stages_wheels_model_and_data_from_s3():
    vpc = "aws.vpc={subnets: [subnet-1], security_group_ids: [sg-1], internet: false}"
    with pytest.raises(ConfigError, match="aws.vpc.internet=False: .*images.wheels, training.model_id, data.source"):
        load_config(ROOT / "pipeline.yaml", [vpc], environ={})
    cfg = load_config(
        ROOT / "pipeline.yaml",
        [vpc, "images.wheels=s3://bkt/wheels/", "training.model_id=s3://bkt/models/bert-base-uncased/",
         "data.source=s3://bkt/polarity/"],
        environ={},
    )
    steps = flatten_steps(json.loads(definition(cfg))["Steps"])
    tokenize = steps["Tokenize"]["Arguments"]
    inputs = {i["InputName"]: (i["S3Input"]["S3Uri"], i["S3Input"]["LocalPath"]) for i in tokenize["ProcessingInputs"]}
    assert inputs["wheels"] == ("s3://bkt/wheels/", "/opt/ml/processing/input/wheels")
    assert inputs["model"] == ("s3://bkt/models/bert-base-uncased/", "/opt/ml/processing/input/model")
    arguments = tokenize["AppSpecification"]["ContainerArguments"]
    assert arguments[arguments.index("--model-id") + 1] == "/opt/ml/processing/input/model"
    train = steps["Train"]["Arguments"]
    channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"] for c in train["InputDataConfig"]}
    assert channels["model"] == "s3://bkt/models/bert-base-uncased/"
    assert train["HyperParameters"]["model-id"] == "/opt/ml/input/data/model"
    for environment in (tokenize["Environment"], train["Environment"], steps["Evaluate"]["Arguments"]["Environment"]):
        assert environment["HF_HUB_OFFLINE"] == "1"  # fail at once rather than wait on the Hub
    assert "wheels" in {i["InputName"] for i in steps["Evaluate"]["Arguments"]["ProcessingInputs"]}


def test_no_cache_key_attribute_of_a_job_step_differs_per_execution(steps):
    """SageMaker's step cache compares each job step's key attributes, resolved: an execution variable in one
    (the execution id in a checkpoint folder, say) makes the step a cache miss in every execution."""
    from pipeline.local.cache import KEY_ATTRIBUTES

    for name, step in steps.items():
        if step["Type"] in KEY_ATTRIBUTES:
            keyed = {a: step["Arguments"].get(a) for a in KEY_ATTRIBUTES[step["Type"]]}
            assert step["CacheConfig"]["Enabled"] and "Execution." not in json.dumps(keyed), name


def test_every_parameter_a_job_step_reads_is_in_its_cache_key(steps):
    """A parameter read only outside the key attributes (TrainInstanceCount in ResourceConfig) would let an
    execution that changes it reuse an earlier run: Train on more instances would be a cache hit."""
    from pipeline.local.cache import KEY_ATTRIBUTES

    for name, step in steps.items():
        if step["Type"] in KEY_ATTRIBUTES and step.get("CacheConfig", {}).get("Enabled"):
            keyed = json.dumps({a: step["Arguments"].get(a) for a in KEY_ATTRIBUTES[step["Type"]]})
            read = set(re.findall(r'"Parameters\.(\w+)"', json.dumps(step["Arguments"])))
            assert {p for p in read if f'"Parameters.{p}"' not in keyed} == set(), name


@pytest.mark.parametrize(("sets", "cached"), [([], True), (["data.source=s3://bucket/reviews/"], False),
                                              (["data.source=s3://bucket/reviews/", "data.immutable=true"], True)])
def test_tokenize_on_an_s3_source_is_cached_only_when_its_files_never_change(sets, cached, no_network_module):
    """SageMaker's cache key holds the InputData URI, not the files under it: a new drop under the same prefix
    would otherwise reuse the old splits."""
    dag = json.loads(definition(load_config(ROOT / "pipeline.yaml", sets, environ={})))
    tokenize = flatten_steps(dag["Steps"])["Tokenize"]
    assert tokenize.get("CacheConfig", {}).get("Enabled", False) is cached
