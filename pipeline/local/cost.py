"""`cost --local`: a local run's job steps priced as if they had run on AWS (nothing was billed): each step's wall
time on this machine at the on-demand rate of the instance type it names in the definition that execution ran."""

from __future__ import annotations

from typing import Any

from pipeline.config import Prices
from pipeline.cost import NOT_INCLUDED, ExecutionCost, TrainingStats, merge_stats, stats_from_tarball
from pipeline.dag.expressions import Context, ExpressionError, evaluate
from pipeline.dag.graph import flatten_steps
from pipeline.local.execution import Execution
from pipeline.local.storage import LocalS3
from pipeline.prices import JobCost
from steps.contract import JOB_STEP_TYPES, MODEL_ARCHIVE, OUTPUT_ARCHIVE


def local_costs(chosen: Execution, definition: dict, s3: LocalS3, prices: Prices) -> ExecutionCost:
    """Would-be AWS costs of the local execution `chosen`, which ran `definition`."""
    steps = flatten_steps(definition["Steps"])
    ctx = Context(parameters=chosen.parameters, execution={})
    jobs: list[JobCost] = []
    training: TrainingStats | None = None
    for name, record in chosen.steps.items():
        if record.type not in JOB_STEP_TYPES or not record.started:
            continue
        args = steps.get(name, {}).get("Arguments", {})
        resources: Any = args.get("ResourceConfig") or args.get("ProcessingResources", {}).get("ClusterConfig", {})
        try:
            resources = evaluate(resources, ctx, f"step {name}")
        except ExpressionError:
            resources = {}
        instance = str(resources.get("InstanceType", "?"))
        properties = record.properties
        running = record.status == "Executing"
        note = "cache hit: no job ran" if record.cached else ("still running" if running else record.reason[:80])
        job = JobCost(
            step=name,
            job=properties.get("TrainingJobName") or properties.get("ProcessingJobName") or "",
            kind=record.type,
            instance_type=instance,
            count=int(resources.get("InstanceCount", 1)),
            seconds=None if running else record.seconds,
            basis="local wall time",
            price=prices.price(instance),
            status=record.status,
            cached=record.cached,
            note=note,
        )
        jobs.append(job)
        model = properties.get("ModelArtifacts", {}).get("S3ModelArtifacts", "")
        if record.type == "Training" and model and not record.cached:
            tarball = s3.path(model.removesuffix(MODEL_ARCHIVE) + OUTPUT_ARCHIVE)
            training = merge_stats(stats_from_tarball(tarball.read_bytes()) if tarball.exists() else None, {})
    notes = [
        "local run: nothing was billed; each cost is the step's wall time on this machine priced at the on-demand "
        "rate of the instance type the step names (a different machine: not a prediction of the AWS bill)",
        NOT_INCLUDED,
    ]
    return ExecutionCost(chosen.id, "local", prices.currency, jobs, training, notes)
