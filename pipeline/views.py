"""Everything the user sees: rich tables and live views in the terminal, and compare's Markdown and PNG.

Views take records (pipeline.records, cost and compare reports) and return renderables or files; they call nothing.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from pipeline.prices import PRICING_URL
from pipeline.records import ExecutionView, OnUpdate, RunSummary, StepView, Upserted, VersionView
from pipeline.tracking.store import KEY_METRICS, KEY_PARAMS, RunRow

if TYPE_CHECKING:
    from pipeline.compare.report import Report
    from pipeline.cost import ExecutionCost
    from pipeline.dag.selection import Selection

STATUS_STYLE = {
    "Succeeded": "green",
    "Completed": "green",
    "Failed": "red",
    "Stopped": "yellow",
    "Stopping": "yellow",
    "Executing": "cyan",
    "Starting": "cyan",
    "InProgress": "cyan",
    "Skipped": "dim",
    "NotStarted": "dim",
}
TRY_IT = ["Great product, works perfectly!", "Broke after two days. Waste of money."]


def styled(status: str) -> str:
    return f"[{STATUS_STYLE.get(status, 'white')}]{status}[/]"


class FittedTable:
    """A table where it fits the width, else one block of `column: value` lines per row (as `kubectl describe`
    does): in a narrow terminal or piped to a file (which rich renders 80 columns wide), no cell is cut."""

    def __init__(self, title: str, columns: list[str], rows: list[list[str]], right: tuple[str, ...] = ()) -> None:
        self.title, self.columns, self.rows = title, columns, rows
        self.table = Table(title=title)
        for column in columns:
            self.table.add_column(column, justify="right" if column in right else "left")
        for row in rows:
            self.table.add_row(*row)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[RenderableType]:
        if Measurement.get(console, options.update_width(100_000), self.table).maximum <= options.max_width:
            yield self.table
            return
        yield Text.from_markup(self.title, style="italic")
        for row in self.rows:
            yield Text("")
            for column, cell in zip(self.columns, row, strict=True):
                if cell:
                    yield Text.assemble((f"{column or 'row'}: ", "bold"), Text.from_markup(cell))


def table(title: str, columns: list[str], rows: list[list[str]], right: tuple[str, ...] = ()) -> FittedTable:
    return FittedTable(title, columns, rows, right)


def print_json(records: Any) -> None:
    """Records (dataclasses, or lists and dicts of them) as JSON on stdout: what `--json` prints."""
    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return plain(dataclasses.asdict(value))
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    sys.stdout.write(json.dumps(plain(records), indent=2, default=str) + "\n")


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, rest = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{rest:02d}s" if hours else f"{minutes}m{rest:02d}s"


def money(value: float | None, currency: str = "USD") -> str:
    if value is None:
        return "unknown"
    symbol = "$" if currency == "USD" else f"{currency} "
    return f"{symbol}{value:,.4f}" if value < 1 else f"{symbol}{value:,.2f}"


# executions


def lineage(view: ExecutionView) -> str:
    """How an execution came about, when not as a plain start: selective (from which execution, which steps),
    retried (how often, where known; on SageMaker a step's attempt count says so)."""
    parts = []
    if view.selected_steps:
        origin = f" from {view.selective_from}" if view.selective_from else ""
        parts.append(f"selective{origin}: {', '.join(view.selected_steps)}")
    if view.retries:
        parts.append(f"retried {view.retries}x")
    elif any(s.attempts > 1 for s in view.steps or []):
        parts.append("retried")
    return "; ".join(parts)


def step_note(step: StepView) -> str:
    return f"reused from {step.reused_from}" if step.reused_from else step.note


def execution_table(view: ExecutionView) -> FittedTable:
    """The steps of one execution."""
    rows = [
        [escape(s.name), s.type, styled(s.status), s.started, duration(s.seconds) if s.started else "",
         str(s.attempts) if s.attempts else "", escape(step_note(s))]
        for s in view.steps or []
    ]
    if view.steps is None:
        rows = [["(steps not available from this endpoint)", "", styled(view.status), view.started, "", "", ""]]
    how = lineage(view)
    return table(f"{view.pipeline} {view.id}  {styled(view.status)}" + (f"  ({escape(how)})" if how else ""),
                 ["step", "type", "status", "started", "duration", "attempt", "note"], rows)


def parameters_table(view: ExecutionView) -> FittedTable:
    return table("parameters", ["name", "value"], [[name, str(value)] for name, value in view.parameters.items()])


def executions_table(views: list[ExecutionView], pipeline: str) -> FittedTable:
    rows = [[v.id, styled(v.status), v.started, v.ended, v.display_name, escape(lineage(v))] for v in views]
    return table(f"executions of {pipeline}", ["execution", "status", "started", "ended", "name", "how"], rows)


def selection_lines(selection: Selection) -> list[str]:
    """What a selective run will do, said before it starts."""
    source = selection.source.id if selection.source else ""
    lines = [f"selected: {', '.join(selection.steps)}"]
    if selection.reused:
        lines.append(f"outputs of {source}: {', '.join(selection.reused)}")
    if selection.not_run:
        lines.append(f"not selected, so not run: {', '.join(selection.not_run)}")
    return lines


def print_status(view: ExecutionView, console: Console) -> None:
    console.print(execution_table(view))
    console.print(parameters_table(view))
    if view.failure_reason:
        console.print(f"[red]{escape(view.failure_reason)}[/]")


@contextmanager
def live(console: Console, render: Callable[[Any], RenderableType], enabled: bool = True) -> Iterator[OnUpdate]:
    """A live view: call the yielded function with each new state, shown as `render` draws it."""
    if not enabled:
        yield lambda state: None
        return
    with Live(console=console, refresh_per_second=2) as screen:
        yield lambda state: screen.update(render(state))


def print_summary(summary: RunSummary, console: Console) -> None:
    """The end of a run: accuracy, failures with their log, the registered version, the endpoint and a curl line."""
    view = summary.execution
    console.print(f"execution {view.id}: {styled(view.status)}")
    if summary.accuracy is not None:
        console.print(f"accuracy on the test split: {summary.accuracy:.4f} (threshold {summary.threshold})")
    for step, reason, lines in summary.failures:
        console.print(f"[red]step {escape(step)} failed:[/] {escape(reason)}")
        if lines:
            console.print("last lines of its log:", style="dim")
            console.print("\n".join(lines), markup=False, highlight=False)
    if summary.registered:
        console.print(f"registered: {summary.group} version {summary.registered.version} ({summary.registered.status})")
        if summary.approve_hint:
            console.print(f"approve it to deploy: {summary.approve_hint}")
    for line in summary.lifecycle:
        console.print(line, markup=False, highlight=False)
    deployment = summary.deployment
    if deployment:
        console.print(f"endpoint {deployment.endpoint} {deployment.action}: {deployment.where}")
        if deployment.where.startswith("http"):
            body = shlex.quote(json.dumps({"inputs": TRY_IT}))
            command = f"curl -s {deployment.where}/invocations -H 'Content-Type: application/json' -d {body}"
            console.print(f"try it: {command}", markup=False, highlight=False, soft_wrap=True)
    console.print(f"logs and artifacts: {summary.artifacts}")
    if summary.plot:
        console.print(f"loss, throughput and confusion matrix: {summary.plot}")


def print_upsert(report: Upserted, name: str, console: Console) -> None:
    console.print(f"code: {len(report.uploaded)} object(s) uploaded, {len(report.skipped)} already there")
    console.print(f"deploy Lambda {name}: {report.deploy_function}")
    console.print(f"pipeline {report.pipeline_arn.rsplit('/', 1)[-1]} {report.action}: {report.pipeline_arn}")
    for kind in ("added", "removed", "changed"):
        if report.steps.get(kind):
            console.print(f"  steps {kind}: {', '.join(report.steps[kind])}")
    if not any(report.steps.values()):
        console.print("  no step changed")


# the registry


def versions_table(versions: list[VersionView], group: str) -> FittedTable:
    def accuracy(value: Any) -> str:
        return f"{value:.4f}" if isinstance(value, float) else str(value or "-")

    rows = [[str(v.version), v.status, accuracy(v.accuracy), v.created] for v in versions]
    return table(f"model package group {group}", ["version", "status", "accuracy", "created"], rows)



# MLflow runs

RUN_HEADERS = {  # short headers, so that a row fits a terminal
    "learning_rate": "lr", "batch_size": "batch", "epochs": "epochs", "world_size": "devices",
    "serving_variant": "serving", "train_loss": "loss", "samples_per_sec": "samples/s",
    "warmup_s": "warm-up s", "val_accuracy": "val acc", "test_accuracy": "test acc", "eval_f1": "f1",
}


def runs_table(rows: list[RunRow], experiment: str, where: str) -> FittedTable:
    """One row per execution's MLflow run: key parameters and metrics side by side."""
    def number(metric: str, value: float | None) -> str:
        if value is None:
            return "-"
        return f"{value:,.1f}" if metric in ("samples_per_sec", "warmup_s") else f"{value:.3f}"

    columns = ["execution", *(RUN_HEADERS.get(c, c) for c in (*KEY_PARAMS, *KEY_METRICS)), "version"]
    cells = [[escape(row.execution), *(escape(str(row.params.get(p, "-"))) for p in KEY_PARAMS),
              *(number(m, row.metrics.get(m)) for m in KEY_METRICS), escape(row.tags.get("model_version", "-"))]
             for row in rows]
    return table(f"MLflow runs of experiment {escape(experiment)} ({escape(where)})", columns, cells)

# cost

BASIS = {
    "BillableTimeInSeconds": "billable",
    "ProcessingEndTime - ProcessingStartTime": "run time",
    "local wall time": "local wall",
}


def cost_table(report: ExecutionCost) -> FittedTable:
    """The per-job table of `cost`."""
    label = "cost (if billed)" if report.where == "local" else "cost"
    where = "local execution" if report.where == "local" else "execution"
    currency, rows = report.currency, []
    for job in report.jobs:
        savings = f"{job.savings:.0%} (on-demand {money(job.on_demand_cost, currency)})" if job.spot else ""
        if job.spot and job.savings is None:
            savings = "spot (savings unknown)"
        rows.append([
            escape(job.step),
            escape(job.job),
            job.instance_type,
            str(job.count),
            "unknown" if job.seconds is None else f"{job.seconds:,.0f}",
            BASIS.get(job.basis, job.basis),
            money(job.price, currency) if job.price is not None else "[yellow]unknown[/]",
            money(job.cost, currency) if job.cost is not None else "[yellow]unknown[/]",
            savings,
            escape(job.note),
        ])
    unknown, total = report.unknown, money(report.total, currency)
    rows.append([
        "total", "", "", "", "", "", "", total if not unknown else f"[yellow]>= {total}[/]", "",
        f"+ {len(unknown)} job(s) of unknown cost: {', '.join(j.step for j in unknown)}" if unknown else "",
    ])
    columns = ["step", "job", "instance", "count", "seconds", "basis", "price/h", label, "spot savings", "note"]
    return table(f"{where} {report.execution}: cost at on-demand prices ({currency})", columns, rows,
                 right=("count", "seconds", "price/h", label))


def throughput_lines(report: ExecutionCost) -> list[str]:
    """The training throughput and cost per million samples, in words."""
    stats = report.training
    if stats is None:
        return ["training throughput: no training job ran in this execution (or its step was a cache hit)"]
    rate = "unknown" if stats.samples_per_sec is None else f"{stats.samples_per_sec:,.1f} samples/s steady state"
    if stats.samples_per_sec_with_warmup is not None:
        rate += f" ({stats.samples_per_sec_with_warmup:,.1f} with the warm-up)"
    if stats.warmup_s is not None:
        rate += f"; warm-up {stats.warmup_s:,.1f} s" + ("" if stats.compile_s is None else
                                                           f" (compiling {stats.compile_s:,.1f} s)")
    samples = "unknown" if stats.samples is None else f"{stats.samples:,.0f}"
    per_m = report.cost_per_million_samples
    return [
        f"training throughput: {rate}; samples trained: {samples} (from {stats.source})",
        f"training cost per million samples: {money(per_m, report.currency)}"
        + ("" if per_m is not None else " (needs the training cost and the sample count)"),
    ]


def print_serving_costs(rows: list[dict], console: Console) -> None:
    """`cost --serving`: a table of the targets, then each figure's source."""
    cells = []
    for row in rows:
        price, cost = row["price_per_hour"], row["cost_per_million"]
        cells.append([row["target"], row["instance_type"],
                      f"{row['requests_per_second']:,.1f}", "unknown" if price is None else f"{price:.3f}",
                      "unknown (set prices.on_demand)" if cost is None else f"{cost:.3f}"])
    columns = ["target", "instance type", "requests/s", "USD/hour", "USD per 1M requests"]
    console.print(FittedTable("Serving targets, BERT-base", columns, cells, right=tuple(columns[2:])))
    console.print(f"at {rows[0]['utilisation']:.0%} of each instance's throughput (serverless: billed per request), "
                  "one BERT-base request a time")
    for row in rows:
        console.print(f"{row['target']}: {row['source']}", style="dim")


def print_cost(report: ExecutionCost, console: Console) -> None:
    console.print(cost_table(report))
    for line in throughput_lines(report):
        console.print(line)
    for note in report.notes:
        console.print(f"note: {note}", style="dim")
    console.print(f"note: prices are the `prices` section of the config; check them at {PRICING_URL}", style="dim")


# compare


def compare_status_table(described: list[dict]) -> FittedTable:
    rows = []
    for job in described:
        start, end = job.get("CreationTime"), job.get("TrainingEndTime")
        if end is None and job["TrainingJobStatus"] in ("Completed", "Failed", "Stopped"):
            end = job.get("LastModifiedTime")
        elapsed = ((end or datetime.now(timezone.utc)) - start).total_seconds() if start else None
        rows.append([job["ResourceConfig"]["InstanceType"], job["TrainingJobName"], styled(job["TrainingJobStatus"]),
                     job.get("SecondaryStatus", ""), duration(elapsed)])
    return table("compare: training jobs", ["instance", "job", "status", "detail", "elapsed"], rows)


def _compare_cells(result: Report) -> list[tuple[str, list[str]]]:
    """(measure, one cell per instance type); a cell after the first carries its ratio to the first."""
    currency = result.currency

    def number(value: float | None, fmt: str) -> str:
        return "unknown" if value is None else format(value, fmt)

    measures = [
        ("job", [r.job.job for r in result.rows]),
        ("status", [r.job.status + (f" ({r.failure[:100]})" if r.failure else "") for r in result.rows]),
        ("global batch x steps",
         [f"{r.global_batch} x {r.steps}" if r.global_batch and r.steps else "unknown" for r in result.rows]),
    ]
    spec = (
        ("wall time", "wall_seconds", lambda r: duration(r.wall_seconds)),
        ("billable time", "billable_seconds",
         lambda r: duration(r.job.seconds) + (f" (spot -{r.job.savings:.0%})" if r.job.savings is not None else "")),
        ("samples/s (steady state)", "samples_per_sec", lambda r: number(r.stats.samples_per_sec, ",.1f")),
        ("samples/s with warm-up", None, lambda r: number(r.stats.samples_per_sec_with_warmup, ",.1f")),
        ("warm-up / compile s", None, lambda r: number(r.stats.warmup_s, ",.1f") + (
            "" if r.stats.compile_s is None else f" / {r.stats.compile_s:,.1f}")),
        ("final loss", None, lambda r: number(r.stats.final_loss, ".4f")),
        ("test accuracy", None, lambda r: number(r.stats.test_accuracy, ".4f")),
        ("val accuracy", None, lambda r: number(r.stats.val_accuracy, ".4f")),
        (f"price per hour ({currency})", None, lambda r: money(r.job.price, currency)),
        (f"cost ({currency})", "cost", lambda r: money(r.job.cost, currency)),
        ("cost per M samples", "cost_per_million_samples", lambda r: money(r.cost_per_million_samples, currency)),
    )
    for label, key, render in spec:
        cells = []
        for index, r in enumerate(result.rows):
            ratio = r.ratios.get(key) if key else None
            cells.append(render(r) if index == 0 or ratio is None else f"{render(r)} ({ratio:.2f}x)")
        measures.append((label, cells))
    return measures


def _header(result: Report) -> list[str]:
    return [r.job.instance_type + (f" x{r.job.count}" if r.job.count > 1 else "") for r in result.rows]


def compare_table(result: Report) -> FittedTable:
    """The comparison: one column per instance type, ratios to the first in parentheses."""
    header = _header(result)
    rows = [[label, *(escape(c) for c in cells)] for label, cells in _compare_cells(result)]
    return table(f"compare: price-performance ({result.currency}; (x) = ratio to {header[0]})", ["", *header], rows,
                 right=tuple(header))


def compare_markdown(result: Report) -> str:
    """The comparison as a Markdown table with its notes, ready to paste into a report."""
    header = _header(result)
    lines = [
        "# Training price-performance: Trainium vs GPU",
        "",
        "The same `train.py`, tokenized data, hyperparameters, global batch and number of steps on each instance "
        f"type. In parentheses: the ratio to {header[0]}.",
        "",
        "| | " + " | ".join(header) + " |",
        "| --- |" + " ---: |" * len(header),
    ]
    for label, cells in _compare_cells(result):
        lines.append(f"| {label} | " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    return "\n".join([*lines, "", *[f"- {note}" for note in result.notes], ""])


def compare_chart(result: Report, path: Path) -> None:
    """A PNG with two bar panels, billable time and cost per instance type (Agg backend, no display)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    labels = [row.job.instance_type.removeprefix("ml.") for row in result.rows]
    figure = Figure(figsize=(10, 4.2), dpi=120)
    FigureCanvasAgg(figure)
    panels = (
        ("billable time (minutes)", [None if r.job.seconds is None else r.job.seconds / 60 for r in result.rows]),
        (f"cost ({result.currency})", [r.job.cost for r in result.rows]),
    )
    for index, (title, values) in enumerate(panels, start=1):
        axes = figure.add_subplot(1, 2, index)
        heights = [v or 0 for v in values]
        bars = axes.bar(labels, heights, color=["#ff9900" if x.startswith("trn") else "#76b900" for x in labels])
        base = values[0]
        for bar, value in zip(bars, values, strict=True):
            text = "unknown" if value is None else f"{value:,.2f}" + (f"\n{value / base:.2f}x" if base else "")
            axes.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom")
        axes.set_title(title)
        axes.set_ylim(0, max(heights + [1e-9]) * 1.3)
        axes.tick_params(axis="x", labelrotation=15)
    figure.suptitle("Same training job per instance type: time and cost")
    figure.tight_layout()
    figure.savefig(path)


def write_compare(result: Report, out: Path) -> list[Path]:
    """compare.md, compare.json and compare.png in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "compare.md", out / "compare.json", out / "compare.png"]
    paths[0].write_text(compare_markdown(result))
    paths[1].write_text(json.dumps(result.to_dict(), indent=2, default=str) + "\n")
    compare_chart(result, paths[2])
    return paths


def stack_event(event: dict) -> str:
    """One CloudFormation stack event as a progress line."""
    reason = event.get("ResourceStatusReason")
    return f"{event['ResourceStatus']:<28} {event['LogicalResourceId']}" + (f"  {reason}" if reason else "")
