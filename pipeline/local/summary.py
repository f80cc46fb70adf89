"""What the console shows about local executions: the end-of-run summary, status and the executions list."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pipeline.local.runner import STYLE, Execution, ExecutionNotFound
from pipeline.local.session import LocalAccount

LOG_TAIL = 15


def _evaluation(account: LocalAccount, execution: Execution) -> dict | None:
    evaluate = execution.steps.get("Evaluate")
    outputs = evaluate.properties.get("ProcessingOutputConfig", {}).get("Outputs", {}) if evaluate else {}
    if "evaluation" not in outputs:
        return None
    path = account.s3.path(outputs["evaluation"]["S3Output"]["S3Uri"]) / "evaluation.json"
    return json.loads(path.read_text()) if path.exists() else None


def print_summary(account: LocalAccount, execution: Execution, console: Console) -> None:
    """Accuracy, the registered version, the endpoint with a working curl example; or why it failed."""
    console.print(f"execution {execution.id}: [{STYLE.get(execution.status, 'white')}]{execution.status}[/]")
    report = _evaluation(account, execution)
    if report:
        accuracy = report["binary_classification_metrics"]["accuracy"]["value"]
        console.print(
            f"accuracy on the test split: {accuracy:.4f} (threshold {execution.parameters['AccuracyThreshold']})"
        )
    failed = [r for r in execution.steps.values() if r.status == "Failed"]
    for record in failed:
        console.print(f"[red]step {record.name} failed:[/] {record.reason}")
        if record.log and Path(record.log).exists():
            lines = Path(record.log).read_text(errors="replace").splitlines()[-LOG_TAIL:]
            console.print(f"last lines of {record.log}:", style="dim")
            console.print("\n".join(lines), markup=False, highlight=False)
    register = execution.steps.get("RegisterModel")
    if register and register.status == "Succeeded":
        version = account.registry.get(account.group, register.properties["ModelPackageVersion"])
        console.print(f"registered: {account.group} version {version.version} ({version.status})")
        if version.status != "Approved":
            console.print(f"approve it to deploy: trainium-pipeline models approve {version.version} --local")
    deploy = execution.steps.get("Deploy")
    if deploy and deploy.status == "Succeeded":
        outputs = deploy.properties.get("OutputParameters", {})
        url, name = outputs.get("url", ""), execution.parameters.get("EndpointName", "")
        body = json.dumps({"inputs": ["Great product, works perfectly!", "Broke after two days. Waste of money."]})
        console.print(f"endpoint {name} {outputs.get('action', '')}: {url}")
        console.print(
            f"try it: curl -s {url}/invocations -H 'Content-Type: application/json' -d {shlex.quote(body)}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
    console.print(f"logs and artifacts: {account.root / 'executions' / execution.pipeline / execution.id}")


def local_status(account: LocalAccount, execution_id: str | None, console: Console) -> None:
    """Steps of the latest (or given) local execution, with its parameters."""
    found = account.executions()
    chosen = next((e for e in found if execution_id in (None, e.id, e.arn)), None)
    if chosen is None:
        raise ExecutionNotFound(f"no local execution {execution_id}" if execution_id else "no local executions yet")
    table = Table(title=f"{chosen.pipeline} {chosen.id}  [{STYLE.get(chosen.status, 'white')}]{chosen.status}[/]")
    for column in ("step", "status", "started", "duration", "note"):
        table.add_column(column)
    for record in chosen.steps.values():
        note = "cache hit" if record.cached else record.reason
        table.add_row(
            record.name,
            f"[{STYLE.get(record.status, 'white')}]{record.status}[/]",
            record.started,
            f"{record.seconds:.1f}s" if record.started else "",
            note,
        )
    console.print(table)
    parameters = Table(title="parameters")
    parameters.add_column("name")
    parameters.add_column("value")
    for name, value in chosen.parameters.items():
        parameters.add_row(name, str(value))
    console.print(parameters)
    if chosen.failure_reason:
        console.print(f"[red]{chosen.failure_reason}[/]")


def local_executions(account: LocalAccount, limit: int) -> Table:
    table = Table(title=f"local executions of {account.cfg.pipeline.name}")
    for column in ("execution", "status", "started", "ended"):
        table.add_column(column)
    for e in account.executions()[:limit]:
        table.add_row(e.id, f"[{STYLE.get(e.status, 'white')}]{e.status}[/]", e.started, e.ended)
    return table
