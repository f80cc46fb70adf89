"""Command line: `trainium-pipeline COMMAND` (or `python -m pipeline COMMAND`): config -> backend -> view."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from pipeline import views
from pipeline.backend import Backend, open_backend
from pipeline.commands import bootstrap, compare, triggers_app
from pipeline.config import ConfigError
from pipeline.contract import APPROVED, REJECTED
from pipeline.dag.parameters import parse_pairs
from pipeline.errors import UserError
from pipeline.terminal import config, console, errors, options

app = typer.Typer(
    help="Fine-tune BERT on AWS Trainium with SageMaker Pipelines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
models_app = typer.Typer(help="Model versions in the registry: list, describe, approve, reject.", no_args_is_help=True)
app.add_typer(models_app, name="models")
app.add_typer(triggers_app, name="triggers")
app.command()(compare)
app.command()(bootstrap)

LOCAL = Annotated[bool, typer.Option("--local", help="On this machine: local runner, registry and endpoint.")]
ROOT = Annotated[Path | None, typer.Option(help="Folder of the local account (default local.root).")]
EXECUTION = Annotated[str | None, typer.Argument(help="Execution id or ARN (default: latest).")]
PARAMS = Annotated[list[str] | None, typer.Option("--param", "-p", help="Pipeline parameter NAME=VALUE (repeatable).")]


@app.callback()
def _options(
    config: Annotated[Path, typer.Option("--config", "-c", help="Config file.")] = Path("pipeline.yaml"),
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a config key, e.g. --set training.epochs=2.")
    ] = None,
) -> None:
    options.update(config=config, set=list(set_ or []))


def backend(local: bool, root: Path | None = None) -> Backend:
    return open_backend(config(), local, root)


@app.command()
def definition(out: Annotated[Path | None, typer.Option(help="Write the JSON here instead of stdout.")] = None) -> None:
    """Print (or write) the pipeline definition JSON. Offline and byte-identical for the same config."""
    from pipeline.definition import definition as build

    text = build(config())
    if out:
        out.write_text(text)
        errors.print(f"wrote {out} ({len(text.encode())} bytes)")
    else:
        sys.stdout.write(text)


@app.command()
def upsert(local: LOCAL = False, root: ROOT = None) -> None:
    """Check the definition, upload step code to content-hashed keys, create or update the pipeline."""
    target = backend(local, root)
    views.print_upsert(target.upsert(), target.cfg.deploy.lambda_function_name, console)


def _start(target: Backend, param: list[str] | None, wait: bool, poll: float, use_cache: bool = True):
    """Start an execution; say its ARN first, then (with `wait`) follow it live to its end."""
    parameters, started = parse_pairs(param or []), []

    def announce(view) -> None:
        if not started:
            started.append(view.arn)
            console.print(f"started {view.arn}")

    with views.live(console, views.execution_table, enabled=wait) as update:
        view = target.start(
            parameters, wait=wait, use_cache=use_cache, on_update=lambda v: (announce(v), update(v)), poll=poll
        )
    announce(view)
    return view


@app.command()
def start(
    param: PARAMS = None,
    wait: Annotated[bool, typer.Option(help="Show live step statuses until the execution ends.")] = False,
    poll: Annotated[float, typer.Option(help="Seconds between status polls with --wait.")] = 30.0,
    local: LOCAL = False,
    root: ROOT = None,
) -> None:
    """Start an execution of the upserted pipeline (locally: run it to its end)."""
    view = _start(backend(local, root), param, wait, poll)
    if wait and view.status != "Succeeded":
        errors.print(f"execution {view.status.lower()}: {view.failure_reason}", markup=False)
        raise typer.Exit(1)


@app.command()
def run(
    local: LOCAL = False,
    param: PARAMS = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Run every step, reusing nothing (local).")] = False,
    root: ROOT = None,
) -> None:
    """The whole pipeline: upsert, start, follow it live, then the summary (accuracy, version, endpoint)."""
    target = backend(local, root)
    target.check(parse_pairs(param or []))  # a bad --param changes nothing, not even the upserted pipeline
    views.print_upsert(target.upsert(), target.cfg.deploy.lambda_function_name, console)
    view = _start(target, param, wait=True, poll=30.0, use_cache=not no_cache)
    views.print_summary(target.summary(view), console)
    if view.status != "Succeeded":
        raise typer.Exit(1)


@app.command()
def status(execution: EXECUTION = None, local: LOCAL = False, root: ROOT = None) -> None:
    """Steps, times and statuses of the latest (or given) execution, and its parameters."""
    views.print_status(backend(local, root).execution(execution), console)


@app.command("executions")
def list_executions(
    limit: Annotated[int, typer.Option(help="How many, newest first.")] = 20, local: LOCAL = False, root: ROOT = None
) -> None:
    """The pipeline's executions, newest first."""
    target = backend(local, root)
    console.print(views.executions_table(target.executions(limit), target.cfg.pipeline.name))


@app.command()
def serve(
    version: Annotated[int | None, typer.Option(help="Model version (default: latest Approved).")] = None,
    port: Annotated[int | None, typer.Option(help="Port on 127.0.0.1 (default local.port).")] = None,
    stop: Annotated[bool, typer.Option("--stop", help="Stop the endpoint left running by run --local.")] = False,
    root: ROOT = None,
) -> None:
    """Serve a local model version on 127.0.0.1 in the foreground (Ctrl-C stops), or --stop the background one."""
    from pipeline.local.endpoint import serve_forever
    from pipeline.local.session import LocalAccount

    account = LocalAccount(config(), root)
    name = account.cfg.deploy.endpoint_name
    if stop:
        console.print(f"endpoint {name} {'stopped' if account.stop_endpoint() else 'was not running'}")
        return
    registry = account.registry
    chosen = registry.get(account.group, version) if version else registry.latest_approved(account.group)
    if chosen is None:
        raise typer.BadParameter("no Approved model version in the local registry; run `run --local` first")
    serve_forever(
        Path(chosen.model_data),
        name,
        port or account.cfg.local.port,
        version=str(chosen.version),
        on_ready=lambda url: console.print(f"serving version {chosen.version} at {url} (Ctrl-C stops)"),
        environment=chosen.environment,
    )


@app.command()
def cost(
    execution: EXECUTION = None,
    local: LOCAL = False,
    root: ROOT = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """What each job of an execution cost (instances x billable seconds x on-demand price), the total, and the
    training throughput and cost per million samples. --local: the would-be AWS cost of a local run's wall time."""
    report = backend(local, root).cost(execution)
    if as_json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    else:
        views.print_cost(report, console)


@models_app.command("list")
def models_list(
    local: LOCAL = False,
    status_filter: Annotated[str | None, typer.Option("--status", help="Only versions with this status.")] = None,
    root: ROOT = None,
) -> None:
    """Versions, newest first: status, accuracy, created."""
    target = backend(local, root)
    console.print(views.versions_table(target.versions(status_filter), target.cfg.pipeline.model_package_group))


@models_app.command("describe")
def models_describe(version: int, local: LOCAL = False, root: ROOT = None) -> None:
    """The full description of a version."""
    console.print_json(json.dumps(backend(local, root).describe_version(version), default=str))


def _set_status(version: int, status: str, note: str, local: bool, root: Path | None) -> None:
    approval = backend(local, root).set_status(version, status, note)
    console.print(f"model version {approval.version.version}: {approval.version.status}")
    done = approval.deployment
    if done:
        console.print(f"endpoint {done.endpoint} {done.action}: {done.where}")
    if approval.hint:
        console.print(approval.hint)


NOTE = Annotated[str, typer.Option(help="Approval note.")]


@models_app.command("approve")
def models_approve(version: int, note: NOTE = "", local: LOCAL = False, root: ROOT = None) -> None:
    """Approve a version; locally this deploys it to the local endpoint, as approval in Studio does on AWS."""
    _set_status(version, APPROVED, note, local, root)


@models_app.command("reject")
def models_reject(version: int, note: NOTE = "", local: LOCAL = False, root: ROOT = None) -> None:
    """Reject a version."""
    _set_status(version, REJECTED, note, local, root)


@app.command()
def deploy(version: int, local: LOCAL = False, root: ROOT = None) -> None:
    """Deploy an Approved model version to the endpoint (created, or updated to a new endpoint config)."""
    done = backend(local, root).deploy(version)
    console.print(f"endpoint {done.endpoint} {done.action}: {done.where}")


def main() -> None:
    """Entry point: expected errors print one line and exit 2 (config) or 1 (everything else)."""
    try:
        app()
    except ConfigError as e:
        errors.print(f"config error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except UserError as e:
        errors.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
