"""Command line: `trainium-pipeline COMMAND` (or `python -m pipeline COMMAND`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pipeline.aws import Aws, AwsError, explained
from pipeline.config import Config, ConfigError, load_config

app = typer.Typer(
    help="Fine-tune BERT on AWS Trainium with SageMaker Pipelines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console(soft_wrap=True)
errors = Console(stderr=True, soft_wrap=True)


class State:
    config_path: Path = Path("pipeline.yaml")
    overrides: list[str] = []

    def config(self) -> Config:
        return load_config(self.config_path, self.overrides)


state = State()

LOCAL = Annotated[bool, typer.Option("--local", help="Use the local runner, registry and endpoint (no AWS).")]
ROOT = Annotated[Path | None, typer.Option(help="Folder of local S3, registry, executions (default local.root).")]


@app.callback()
def _options(
    config: Annotated[Path, typer.Option("--config", "-c", help="Config file.")] = Path("pipeline.yaml"),
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override a config key, e.g. --set training.epochs=2 (repeatable)."),
    ] = None,
) -> None:
    state.config_path = config
    state.overrides = list(set_ or [])


def _definition_json(cfg: Config) -> str:
    from pipeline.definition import definition

    return definition(cfg)


def _execution_arn(cfg: Config, aws: Aws, execution: str | None) -> str:
    if execution and execution.startswith("arn:"):
        return execution
    if execution:
        return (
            f"arn:aws:sagemaker:{cfg.aws.region}:{cfg.aws.account}:pipeline/"
            f"{cfg.pipeline.name.lower()}/execution/{execution}"
        )
    with explained(f"list executions of {cfg.pipeline.name}"):
        arn = aws.latest_execution_arn(cfg.pipeline.name)
    if not arn:
        raise AwsError(f"pipeline {cfg.pipeline.name} has no executions yet (run: trainium-pipeline start)")
    return arn


@app.command()
def definition(
    out: Annotated[Path | None, typer.Option(help="Write the JSON here instead of stdout.")] = None,
) -> None:
    """Print (or write) the pipeline definition JSON. Offline and byte-identical for the same config."""
    text = _definition_json(state.config())
    if out:
        out.write_text(text)
        errors.print(f"wrote {out} ({len(text.encode())} bytes)")
    else:
        sys.stdout.write(text)


@app.command()
def upsert() -> None:
    """Upload step code to content-hashed S3 keys and create or update the pipeline."""
    from pipeline.upsert import upsert as do_upsert

    cfg = state.config()
    report = do_upsert(cfg, _definition_json(cfg), Aws(cfg.aws.region))
    console.print(f"code: {len(report.uploaded)} object(s) uploaded, {len(report.skipped)} already there")
    console.print(f"deploy Lambda {cfg.deploy.lambda_function_name}: {report.lambda_action}")
    console.print(f"pipeline {cfg.pipeline.name} {report.action}: {report.pipeline_arn}")
    for kind in ("added", "removed", "changed"):
        if report.steps.get(kind):
            console.print(f"  steps {kind}: {', '.join(report.steps[kind])}")
    if not any(report.steps.values()):
        console.print("  no step changed")


@app.command()
def start(
    param: Annotated[
        list[str] | None,
        typer.Option("--param", "-p", help="Pipeline parameter NAME=VALUE (repeatable), e.g. Epochs=3."),
    ] = None,
    wait: Annotated[bool, typer.Option(help="Show live step statuses until the execution ends.")] = False,
    poll: Annotated[float, typer.Option(help="Seconds between status polls with --wait.")] = 30.0,
) -> None:
    """Start an execution of the pipeline (upsert it first)."""
    from pipeline import executions

    cfg = state.config()
    declared = json.loads(_definition_json(cfg))["Parameters"]
    parameters = executions.parse_parameters(list(param or []), declared)
    aws = Aws(cfg.aws.region)
    arn = executions.start(aws, cfg.pipeline.name, parameters)
    console.print(f"started {arn}")
    if wait:
        execution = executions.wait(aws, arn, console, poll)
        status = execution["PipelineExecutionStatus"]
        if status != "Succeeded":
            errors.print(f"execution {status.lower()}: {executions.failure_reason(execution, execution['_steps'])}")
            raise typer.Exit(1)


@app.command()
def status(
    execution: Annotated[str | None, typer.Argument(help="Execution id or ARN (default: latest).")] = None,
    local: LOCAL = False,
    root: ROOT = None,
) -> None:
    """Steps, times and statuses of the latest (or given) execution, and its parameters."""
    from pipeline import executions

    if local:
        from pipeline.local.summary import local_status

        local_status(_local(root), execution, console)
        return
    cfg = state.config()
    aws = Aws(cfg.aws.region)
    arn = _execution_arn(cfg, aws, execution)
    table, _, _ = executions.execution_table(aws, arn)
    console.print(table)
    console.print(executions.parameters_table(aws, arn))


@app.command("executions")
def list_executions(
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 20, local: LOCAL = False, root: ROOT = None
) -> None:
    """The pipeline's executions, newest first."""
    from pipeline import executions

    if local:
        from pipeline.local.summary import local_executions

        console.print(local_executions(_local(root), limit))
        return
    cfg = state.config()
    console.print(executions.executions_table(Aws(cfg.aws.region), cfg.pipeline.name, limit))


def _params(pairs: list[str] | None) -> dict[str, str]:
    from pipeline.executions import ParameterError

    parsed = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        if not sep:
            raise ParameterError(f"--param {pair!r}: expected NAME=VALUE")
        parsed[name] = value
    return parsed


def _local(root: Path | None):
    from pipeline.local.session import LocalAccount

    cfg = state.config()
    return LocalAccount(cfg, root)


@app.command()
def run(
    local: LOCAL = False,
    param: Annotated[
        list[str] | None, typer.Option("--param", "-p", help="Pipeline parameter NAME=VALUE (repeatable).")
    ] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Run every step, reusing nothing.")] = False,
    root: ROOT = None,
) -> None:
    """Run the whole pipeline: `--local` on this machine from the same definition, else upsert + start --wait."""
    if not local:
        upsert()
        start(param=param, wait=True, poll=30.0)
        return
    from pipeline.local.summary import print_summary

    account = _local(root)
    execution = account.run(_params(param), use_cache=not no_cache, console=console)
    print_summary(account, execution, console)
    if execution.status != "Succeeded":
        raise typer.Exit(1)


@app.command()
def serve(
    version: Annotated[int | None, typer.Option(help="Model version (default: latest Approved).")] = None,
    port: Annotated[int | None, typer.Option(help="Port on 127.0.0.1 (default local.port).")] = None,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the endpoint left running by run --local.")] = False,
    root: ROOT = None,
) -> None:
    """Serve a registered model version on 127.0.0.1 in the foreground (Ctrl-C stops), or --stop the background one."""
    account = _local(root)
    if stop:
        stopped = account.stop_endpoint()
        console.print(f"endpoint {account.cfg.deploy.endpoint_name} {'stopped' if stopped else 'was not running'}")
        return
    from pipeline.local.endpoint import serve_forever

    chosen = (
        account.registry.get(account.group, version) if version else account.registry.latest_approved(account.group)
    )
    if chosen is None:
        raise typer.BadParameter("no Approved model version in the local registry; run `run --local` first")
    serve_forever(
        Path(chosen.model_data),
        account.cfg.deploy.endpoint_name,
        port or account.cfg.local.port,
        version=str(chosen.version),
        on_ready=lambda url: console.print(f"serving version {chosen.version} at {url} (Ctrl-C stops)"),
        environment=chosen.environment,
    )


@app.command()
def cost(
    execution: Annotated[str | None, typer.Argument(help="Execution id or ARN (default: latest).")] = None,
    local: LOCAL = False,
    root: ROOT = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """What each job of an execution cost (instances x billable seconds x on-demand price), the total, and the
    training throughput and cost per million samples. --local: the would-be AWS cost of a local run's wall time."""
    from pipeline import cost as costs

    cfg = state.config()
    if local:
        report = costs.local_costs(_local(root), execution, cfg.prices)
    else:
        aws = Aws(cfg.aws.region)
        report = costs.sagemaker_costs(aws, _execution_arn(cfg, aws, execution), cfg.prices)
    if as_json:
        sys.stdout.write(costs.to_json(report) + "\n")
    else:
        costs.print_report(report, console)


@app.command()
def compare(
    instance_types: Annotated[
        list[str] | None,
        typer.Option("--instance-types", "-i", help="Instance types, the baseline first: -i A B C or -i A,B,C."),
    ] = None,
    more: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="TYPE_OR_JOB...", help="More instance types (job names with --jobs).", show_default=False
        ),
    ] = None,
    jobs: Annotated[
        list[str] | None,
        typer.Option("--jobs", help="Report on these training jobs (started by compare) instead of starting new ones."),
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(help="S3 prefix holding tokenized train/ and validation/ (default: latest succeeded execution)."),
    ] = None,
    max_steps: Annotated[int, typer.Option(help="Optimizer steps of every run.")] = 1000,
    global_batch: Annotated[
        int | None,
        typer.Option(
            help="Samples per optimizer step of every run (default: the configured training's).", show_default=False
        ),
    ] = None,
    max_device_batch: Annotated[int, typer.Option(help="Largest per-device batch; more uses grad accumulation.")] = 64,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the job requests; start nothing.")] = False,
    out: Annotated[Path, typer.Option(help="Folder for compare.md, compare.json, compare.png.")] = Path("compare"),
    wait_: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait for the jobs and write the report.")] = True,
    poll: Annotated[float, typer.Option(help="Seconds between status polls.")] = 60.0,
) -> None:
    """Run the Train step alone once per instance type (same data, hyperparameters, global batch and steps) and
    show wall time, billable time, samples/s, loss, accuracy and cost side by side, with ratios to the first."""
    from pipeline import compare as cmp

    cfg = state.config()
    aws: Aws | None = None
    if jobs and instance_types:
        raise cmp.CompareError("--jobs and --instance-types: expected one of them, not both")
    if jobs:
        names = [*jobs, *(more or [])]
    else:
        types = [t for value in [*(instance_types or []), *(more or [])] for t in value.split(",") if t]
        cmp.check_instance_types(types)
        tokenized = cmp.tokenized_at(data) if data else None
        definition = json.loads(_definition_json(cfg))
        if tokenized is None:
            aws = Aws(cfg.aws.region)
            tokenized = cmp.latest_tokenized(aws, cfg, definition)
        planned = cmp.plan(
            cfg,
            definition,
            types,
            tokenized,
            max_steps=max_steps,
            global_batch=global_batch,
            max_device_batch=max_device_batch,
        )
        errors.print(
            f"{len(planned.requests)} job(s): global batch {planned.global_batch}, {planned.max_steps} steps, "
            f"data {tokenized['train'].rsplit('/', 1)[0]}"
        )
        if dry_run:
            sys.stdout.write(json.dumps(planned.to_dict(), indent=2) + "\n")
            return
        aws = aws or Aws(cfg.aws.region)
        names = cmp.start(aws, cfg, planned)
        out.mkdir(parents=True, exist_ok=True)
        (out / "requests.json").write_text(json.dumps(planned.to_dict(), indent=2) + "\n")
        console.print(f"started {', '.join(names)}")
        console.print(f"report later with: trainium-pipeline compare --out {out} --jobs {' '.join(names)}")
        if not wait_:
            return
    aws = aws or Aws(cfg.aws.region)
    described = cmp.wait(aws, names, console, poll) if wait_ else cmp.describe(aws, names)
    result = cmp.report(aws, cfg, described)
    console.print(cmp.table(result))
    for path in cmp.write_outputs(result, out):
        console.print(f"wrote {path}")


models_app = typer.Typer(help="Model versions in the registry: list, describe, approve, reject.", no_args_is_help=True)
app.add_typer(models_app, name="models")


def _aws_and_group():
    cfg = state.config()
    return cfg, Aws(cfg.aws.region), cfg.pipeline.model_package_group


@models_app.command("list")
def models_list(
    local: LOCAL = False,
    status_filter: Annotated[str | None, typer.Option("--status", help="Only versions with this status.")] = None,
    root: ROOT = None,
) -> None:
    """Versions, newest first: status, accuracy, created."""
    from rich.table import Table

    if local:
        account = _local(root)
        group = account.group
        rows = [
            {"version": v.version, "status": v.status, "accuracy": v.accuracy, "created": v.created, "note": v.note}
            for v in account.registry.list(group, status=status_filter)
        ]
    else:
        from pipeline import models_aws

        _, aws, group = _aws_and_group()
        rows = models_aws.list_versions(aws, group, status_filter)
    table = Table(title=f"model package group {group}")
    for column in ("version", "status", "accuracy", "created"):
        table.add_column(column)
    for row in rows:
        accuracy = row.get("accuracy")
        accuracy = f"{accuracy:.4f}" if isinstance(accuracy, float) else str(accuracy or "-")
        table.add_row(str(row["version"]), row["status"], accuracy, str(row["created"]))
    console.print(table)


@models_app.command("describe")
def models_describe(version: int, local: LOCAL = False, root: ROOT = None) -> None:
    """The full description of a version."""
    if local:
        account = _local(root)
        console.print_json(json.dumps(account.registry.get(account.group, version).describe(), default=str))
        return
    from pipeline import models_aws

    _, aws, group = _aws_and_group()
    console.print_json(json.dumps(models_aws.describe(aws, group, version), default=str))


def _set_status(version: int, status: str, note: str, local: bool, root: Path | None) -> None:
    if not local:
        from pipeline import models_aws

        _, aws, group = _aws_and_group()
        changed = models_aws.set_status(aws, group, version, status, note)
        console.print(f"model version {version}: {changed['status']}")
        if status == "Approved":
            console.print(
                f"the deploy-on-approval rule (triggers apply) deploys it, or run: trainium-pipeline deploy {version}"
            )
        return
    account = _local(root)
    changed = account.registry.set_status(account.group, version, status, note)
    console.print(f"model version {changed.version}: {changed.status}")
    if status == "Approved":
        result = account.deploy(changed)
        console.print(f"endpoint {account.cfg.deploy.endpoint_name} {result['action']}: {result['url']}")


@models_app.command("approve")
def models_approve(
    version: int,
    note: Annotated[str, typer.Option(help="Approval note.")] = "",
    local: LOCAL = False,
    root: ROOT = None,
) -> None:
    """Approve a version; locally this deploys it to the local endpoint, as approval in Studio does on AWS."""
    _set_status(version, "Approved", note, local, root)


@models_app.command("reject")
def models_reject(
    version: int,
    note: Annotated[str, typer.Option(help="Rejection note.")] = "",
    local: LOCAL = False,
    root: ROOT = None,
) -> None:
    """Reject a version."""
    _set_status(version, "Rejected", note, local, root)


def load_deploy_handler():
    """`steps/deploy.py`, the deploy Lambda's code (steps/ is container code, not a package)."""
    import importlib.util

    from pipeline.code import PROJECT_ROOT

    spec = importlib.util.spec_from_file_location("deploy_handler", PROJECT_ROOT / "steps" / "deploy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@app.command()
def deploy(version: int, local: LOCAL = False, root: ROOT = None) -> None:
    """Deploy an Approved model version to the endpoint (created, or updated to a new endpoint config)."""
    if local:
        account = _local(root)
        result = account.deploy(account.registry.get(account.group, version))
        console.print(f"endpoint {account.cfg.deploy.endpoint_name} {result['action']}: {result['url']}")
        return
    from pipeline import models_aws
    from pipeline.aws import explained

    cfg, aws, group = _aws_and_group()
    handler = load_deploy_handler()
    arn = models_aws.describe(aws, group, version)["arn"]
    try:
        with explained(f"deploy version {version}"):
            result = handler.deploy(
                aws.sagemaker,
                arn,
                cfg.deploy.endpoint_name,
                cfg.deploy.instance_type,
                cfg.deploy.instance_count,
                role_arn=cfg.aws.role_arn,
                data_capture_s3_uri=cfg.deploy.data_capture_s3_uri,
                guardrails_alarm=cfg.deploy.guardrails_alarm,
            )
    except (handler.NotApproved, handler.DeployError) as e:
        raise AwsError(str(e)) from None
    console.print(f"endpoint {result['endpoint_name']} {result['action']}: config {result['endpoint_config_name']}")


triggers_app = typer.Typer(help="EventBridge rules: deploy on approval, schedule, new data.", no_args_is_help=True)
app.add_typer(triggers_app, name="triggers")


def _trigger_settings(cfg: Config):
    from pipeline.triggers import TriggerSettings

    return TriggerSettings(**cfg.triggers.model_dump())


@triggers_app.command("apply")
def triggers_apply(
    print_only: Annotated[bool, typer.Option("--print-only", help="Show the rules without creating them.")] = False,
    print_policies: Annotated[
        bool, typer.Option("--print-policies", help="Print the IAM policies the rules and the Lambda need.")
    ] = False,
) -> None:
    """Create or update the rules (idempotent); a rule whose option was turned off is deleted."""
    from pipeline import triggers

    cfg = state.config()
    if print_policies:
        console.print_json(json.dumps(triggers.policies(cfg)))
        return
    rows = triggers.apply(cfg, None if print_only else Aws(cfg.aws.region), print_only, settings=_trigger_settings(cfg))
    for row in rows:
        console.print(f"{row['action']:>9}  {row['name']}")


@triggers_app.command("list")
def triggers_list() -> None:
    """The rules that apply made, with their targets."""
    from pipeline import triggers

    cfg = state.config()
    console.print_json(json.dumps(triggers.list_(cfg, Aws(cfg.aws.region)), default=str))


@triggers_app.command("delete")
def triggers_delete() -> None:
    """Remove exactly the rules, targets and permission that apply made."""
    from pipeline import triggers

    cfg = state.config()
    removed = triggers.delete(cfg, Aws(cfg.aws.region))
    console.print(f"deleted: {', '.join(removed) or 'nothing'}")


def main() -> None:
    """Entry point: expected errors print one line and exit 2 (config) or 1 (AWS, parameters)."""
    from pipeline.compare import CompareError
    from pipeline.executions import ParameterError
    from pipeline.local.expressions import ExpressionError
    from pipeline.local.registry import ModelNotFoundError
    from pipeline.local.runner import ExecutionNotFound
    from pipeline.local.runner import ParameterError as LocalParameterError
    from pipeline.local.session import DeployRefused

    one_line = (AwsError, ParameterError, CompareError, ExpressionError, ModelNotFoundError, LocalParameterError,
                DeployRefused, ExecutionNotFound)
    try:
        app()
    except ConfigError as e:
        errors.print(f"config error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except one_line as e:
        errors.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
