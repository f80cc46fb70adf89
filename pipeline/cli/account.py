"""The Account panel: `bootstrap` (the account's stack), `upsert`, `definition`, `config show`, `compare`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from pipeline import views
from pipeline.cli.shared import JSON, LOCAL, ROOT, console, errors
from pipeline.compare.plan import DEFAULT_MAX_DEVICE_BATCH, DEFAULT_MAX_STEPS
from pipeline.sagemaker.aws import Aws

PANEL = "Account"
config_app = typer.Typer(help="The effective config: every key, its value and where it came from.",
                         no_args_is_help=True)


def bootstrap(
    ctx: typer.Context,
    stack_name: Annotated[str | None, typer.Option(help="Stack name (default <pipeline.name>-bootstrap).")] = None,
    print_: Annotated[bool, typer.Option("--print", help="Print --set lines instead of editing the config.")] = False,
    kms_key: Annotated[
        bool | None,
        typer.Option("--kms-key/--no-kms-key", help="A KMS key for bucket, volumes, outputs (default: keep as is)."),
    ] = None,
    bucket: Annotated[str | None, typer.Option(help="Bucket name at creation (default <pipeline>-<account>-<region>).")]
    = None,
    delete: Annotated[bool, typer.Option("--delete", help="Delete the stack (refused while its bucket holds data, "
                                         "its model package group versions, or endpoints run as its role).")]
    = False,
    force: Annotated[bool, typer.Option("--force", help="With --delete: delete every object version first.")] = False,
) -> None:
    """Create or update the account's bucket, roles, model package group and alerts topic (infra/template.yaml),
    then write their names into the config (or print them as --set options). A second run changes nothing."""
    from pipeline.config import file as config_file
    from pipeline.sagemaker import bootstrap as infra
    from pipeline.sagemaker.stacks import Waiting

    cfg = ctx.obj.load()
    aws = Aws(cfg.aws.region)
    cf = aws.client("cloudformation")

    waiting = Waiting(on_event=lambda event: errors.print(views.stack_event(event), markup=False, highlight=False))

    if delete:
        done = infra.delete_stack(cfg, cf, aws.s3, aws.sagemaker, stack_name, force=force, waiting=waiting)
        emptied = f" ({done.emptied} object version(s) deleted)" if done.emptied else ""
        console.print(f"stack {done.stack_name} {done.action}{emptied}")
        return
    parameters = infra.stack_parameters(cfg, bucket=bucket, kms=kms_key)
    result = infra.deploy_stack(cfg, cf, stack_name, parameters, waiting)
    console.print(f"stack {result.stack_name} {result.action}")
    updates = infra.config_updates(result.outputs)
    if print_:
        sys.stdout.write("".join(line + "\n" for line in config_file.set_lines(updates)))
        return
    changed = config_file.write_config(ctx.obj.config, updates)
    console.print(f"{ctx.obj.config}: {'set ' + ', '.join(changed) if changed else 'already up to date'}")


def upsert(ctx: typer.Context, local: LOCAL = False, root: ROOT = None) -> None:
    """Check the definition, upload step code to content-hashed keys, create or update the pipeline."""
    target = ctx.obj.backend(local, root)
    views.print_upsert(target.upsert(), target.cfg.deploy.lambda_function_name, console)

def definition(
    ctx: typer.Context, out: Annotated[Path | None, typer.Option(help="Write the JSON here instead of stdout.")] = None
) -> None:
    """Print (or write) the pipeline definition JSON. Offline and byte-identical for the same config."""
    from pipeline.definition import definition as build

    text = build(ctx.obj.load())
    if out:
        out.write_text(text)
        errors.print(f"wrote {out} ({len(text.encode())} bytes)")
    else:
        sys.stdout.write(text)

@config_app.command("show")
def config_show(ctx: typer.Context, local: LOCAL = False, as_json: JSON = False) -> None:
    """Every key of the effective config (--local: with the local profile) as `key = JSON value  # where from`:
    default, the file, the local profile, an environment variable or --set."""
    from pipeline.config import effective, load_config

    sources: dict[str, str] = {}
    rows = effective(load_config(ctx.obj.config, ctx.obj.sets, local=local, sources=sources), sources)
    if as_json:
        return views.print_json({key: {"value": value, "source": source} for key, value, source in rows})
    for key, value, source in rows:
        console.print(f"{key} = {json.dumps(value)}  # {source}", markup=False, highlight=False)

def compare(
    ctx: typer.Context,
    instance_types: Annotated[
        list[str] | None,
        typer.Option("--instance-types", "-i", help="Instance types, the baseline first: -i A B C or -i A,B,C."),
    ] = None,
    more: Annotated[
        list[str] | None,
        typer.Argument(metavar="TYPE_OR_JOB...", help="More instance types (or job names).", show_default=False),
    ] = None,
    jobs: Annotated[
        list[str] | None, typer.Option("--jobs", help="Report on these training jobs (started by compare).")
    ] = None,
    data: Annotated[
        str | None, typer.Option(help="S3 prefix holding tokenized train/ validation/ test/ (default: latest run).")
    ] = None,
    max_steps: Annotated[int, typer.Option(help="Optimizer steps of every run.")] = DEFAULT_MAX_STEPS,
    global_batch: Annotated[
        int | None, typer.Option(help="Samples per optimizer step (default: the configured training's).")
    ] = None,
    max_device_batch: Annotated[
        int, typer.Option(help="Largest per-device batch; more uses grad accumulation.")
    ] = DEFAULT_MAX_DEVICE_BATCH,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the job requests; start nothing.")] = False,
    out: Annotated[Path, typer.Option(help="Folder for compare.md, compare.json, compare.png.")] = Path("compare"),
    wait_: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait for the jobs and write the report.")] = True,
    poll: Annotated[float, typer.Option(help="Seconds between status polls.")] = 60.0,
) -> None:
    """Run the Train step alone once per instance type (same data, hyperparameters, global batch and steps) and
    show wall time, billable time, samples/s, loss, accuracy and cost side by side, with ratios to the first."""
    from pipeline import compare as cmp

    if jobs and instance_types:
        raise cmp.CompareError("--jobs and --instance-types: expected one of them, not both")
    comparison = cmp.Comparison(ctx.obj.load())
    names = [*jobs, *(more or [])] if jobs else []
    if not jobs:
        planned = comparison.plan(cmp.instance_types([*(instance_types or []), *(more or [])]), data,
                                  max_steps=max_steps, global_batch=global_batch, max_device_batch=max_device_batch)
        errors.print(f"{len(planned.requests)} job(s): global batch {planned.global_batch}, {planned.max_steps} steps, "
                     f"data {planned.data['train'].rsplit('/', 1)[0]}")
        if dry_run:
            sys.stdout.write(json.dumps(planned.to_dict(), indent=2) + "\n")
            return
        names = comparison.start(planned, out)
        console.print(f"started {', '.join(names)}")
        console.print(f"report later with: trainium-pipeline compare --out {out} --jobs {' '.join(names)}")
        if not wait_:
            return
    with views.live(console, views.compare_status_table, enabled=wait_) as update:
        result = comparison.report(names, follow=wait_, poll=poll, on_update=update)
    console.print(views.compare_table(result))
    for path in views.write_compare(result, out):
        console.print(f"wrote {path}")


def register(app: typer.Typer) -> None:
    for command in (bootstrap, upsert, definition):
        app.command(rich_help_panel=PANEL)(command)
    app.add_typer(config_app, name="config", rich_help_panel=PANEL)
    app.command(rich_help_panel=PANEL)(compare)
