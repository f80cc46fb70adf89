"""Deploy and delete a CloudFormation stack: create it, or update it where its template, parameters or tags differ,
and wait with botocore's waiters; a failure said in one line, naming the resource that failed and why. The account
stack (`bootstrap`) and the pipeline stack (`upsert`, `triggers`) both go through here."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, WaiterError

from pipeline.errors import UserError
from pipeline.sagemaker.aws import explain

EventCallback = Callable[[dict], None]


class StackError(UserError, RuntimeError):
    """A stack could not be deployed or deleted: said in one line."""


@dataclass
class StackResult:
    """What deploy / delete did: action is created, updated, unchanged, deleted or absent."""

    action: str
    stack_name: str
    outputs: dict[str, str] = field(default_factory=dict)
    emptied: int = 0  # object versions deleted from the account bucket (bootstrap --delete --force)


@dataclass(frozen=True)
class Waiting:
    """How deploy / delete report and wait: each new stack event to `on_event`, a poll every `poll` s, at most
    `timeout` s."""

    on_event: EventCallback | None = None
    poll: float = 5.0
    timeout: float = 3600.0


WAIT = Waiting()  # no report, a poll every 5 s, at most an hour


def call(action: str, method: Callable[..., Any], **kwargs: Any) -> Any:
    """`method(**kwargs)`, a botocore failure raised as StackError saying `action`."""
    try:
        return method(**kwargs)
    except (BotoCoreError, ClientError) as e:
        raise StackError(explain(e, action)) from None


def describe(cf: Any, stack: str, deleted: bool = False) -> dict | None:
    """The stack's description, or None if it does not exist (or was deleted, unless `deleted`)."""
    try:
        found = cf.describe_stacks(StackName=stack)["Stacks"]
    except (BotoCoreError, ClientError) as e:
        if isinstance(e, ClientError) and "does not exist" in e.response.get("Error", {}).get("Message", ""):
            return None
        raise StackError(explain(e, f"describe stack {stack}")) from None
    if not found or (found[0]["StackStatus"] == "DELETE_COMPLETE" and not deleted):
        return None
    return found[0]


def outputs(stack: dict) -> dict[str, str]:
    return {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}


def new_events(cf: Any, stack: str, seen: set[str]) -> list[dict]:
    """Events not seen yet, oldest first (the API lists newest first, paginated)."""
    fresh: list[dict] = []
    token: str | None = None
    while True:
        request = {"StackName": stack, **({"NextToken": token} if token else {})}
        page = call(f"read events of stack {stack}", cf.describe_stack_events, **request)
        for event in page.get("StackEvents", []):
            if event["EventId"] in seen:
                token = None
                break
            fresh.append(event)
        else:
            token = page.get("NextToken")
        if not token:
            break
    seen.update(e["EventId"] for e in fresh)
    return fresh[::-1]


def failure_reason(events: list[dict]) -> str:
    """The first resource that failed and why, as `Logical (Type) STATUS: reason`."""
    failed = [e for e in events if e.get("ResourceStatus", "").endswith("_FAILED")]
    causes = [e for e in failed if "cancelled" not in (e.get("ResourceStatusReason") or "").lower()] or failed
    if not causes:
        return "no failed resource reported"
    e = causes[0]
    reason = " ".join((e.get("ResourceStatusReason") or "no reason given").split())
    return f"{e['LogicalResourceId']} ({e.get('ResourceType', '')}) {e['ResourceStatus']}: {reason}"


def wait_stack(cf: Any, stack: str, operation: str, seen: set[str], waiting: Waiting = WAIT) -> dict | None:
    """Wait for `operation` (CREATE, UPDATE or DELETE) with botocore's waiter, then pass the stack's new events to
    on_event; the final description. Unless the operation completed, raise StackError naming the failed resource
    and its reason."""
    poll, timeout = waiting.poll, waiting.timeout
    config = {"Delay": max(0, round(poll)), "MaxAttempts": max(1, round(timeout / max(poll, 1.0)))}
    try:
        cf.get_waiter(f"stack_{operation.lower()}_complete").wait(StackName=stack, WaiterConfig=config)
    except WaiterError:
        pass  # said below, from the stack's status and events
    described = describe(cf, stack, deleted=True)
    status = described["StackStatus"] if described else "DELETE_COMPLETE"
    events = new_events(cf, stack, seen) if described else []
    for event in events:
        if waiting.on_event:
            waiting.on_event(event)
    if status.endswith("_IN_PROGRESS"):
        raise StackError(f"stack {stack}: still {status} after {timeout:.0f} s; see the CloudFormation console")
    if status != f"{operation}_COMPLETE":
        raise StackError(f"stack {stack}: {operation.lower()} failed ({status}): {failure_reason(events)}")
    return None if status == "DELETE_COMPLETE" else described


def _unchanged(cf: Any, stack: dict, body: str, params: dict[str, str], tags: list[dict]) -> bool:
    """True when the deployed template, parameters and tags are those we would send."""
    name = stack["StackName"]
    current = call(f"read template of stack {name}", cf.get_template, StackName=name)["TemplateBody"]
    same_body = current == body if isinstance(current, str) else current == json.loads(body)  # botocore parses JSON
    deployed = {p["ParameterKey"]: p.get("ParameterValue", "") for p in stack.get("Parameters", [])}
    same_tags = sorted((t["Key"], t["Value"]) for t in stack.get("Tags", [])) == [(t["Key"], t["Value"]) for t in tags]
    return same_body and all(deployed.get(k) == v for k, v in params.items()) and same_tags


def deploy(cf: Any, name: str, body: str, params: dict[str, str], tags: dict[str, str],
           capabilities: tuple[str, ...] = (), waiting: Waiting = WAIT) -> StackResult:
    """Create stack `name`, or update it where template, parameters or tags differ; wait; return its outputs. A
    parameter left out of `params` keeps its deployed value on update (its default on create). A stack left
    ROLLBACK_COMPLETE by a failed first create (it holds nothing) is deleted and created again."""
    tag_list = [{"Key": k, "Value": v} for k, v in sorted(tags.items())]
    request = {"StackName": name, "TemplateBody": body, "Capabilities": list(capabilities), "Tags": tag_list,
               "Parameters": [{"ParameterKey": k, "ParameterValue": v} for k, v in params.items()]}
    stack = describe(cf, name)
    if stack is not None and stack["StackStatus"].endswith("_IN_PROGRESS"):
        raise StackError(f"stack {name} is {stack['StackStatus']}: retry when it has finished")
    if stack is not None and stack["StackStatus"] == "ROLLBACK_COMPLETE":
        seen = {e["EventId"] for e in new_events(cf, name, set())}
        call(f"delete stack {name} (ROLLBACK_COMPLETE)", cf.delete_stack, StackName=stack["StackId"])
        wait_stack(cf, stack["StackId"], "DELETE", seen, waiting)
        stack = None
    if stack is None:
        stack_id = call(f"create stack {name}", cf.create_stack, **request)["StackId"]
        final = wait_stack(cf, stack_id, "CREATE", set(), waiting)
        return StackResult("created", name, outputs(final or {}))
    if _unchanged(cf, stack, body, params, tag_list):
        return StackResult("unchanged", name, outputs(stack))
    seen = {e["EventId"] for e in new_events(cf, name, set())}
    kept = [{"ParameterKey": p["ParameterKey"], "ParameterValue": p.get("ParameterValue", "")}  # deployed values
            for p in stack.get("Parameters", []) if p["ParameterKey"] not in params]
    try:
        cf.update_stack(**{**request, "Parameters": request["Parameters"] + kept})
    except ClientError as e:
        if "No updates are to" in e.response.get("Error", {}).get("Message", ""):
            return StackResult("unchanged", name, outputs(stack))
        raise StackError(explain(e, f"update stack {name}")) from None
    except BotoCoreError as e:
        raise StackError(explain(e, f"update stack {name}")) from None
    final = wait_stack(cf, stack["StackId"], "UPDATE", seen, waiting)
    return StackResult("updated", name, outputs(final or {}))


def delete(cf: Any, stack: dict, waiting: Waiting = WAIT) -> None:
    """Delete the described `stack` and wait until it is gone."""
    seen = {e["EventId"] for e in new_events(cf, stack["StackName"], set())}
    call(f"delete stack {stack['StackName']}", cf.delete_stack, StackName=stack["StackId"])
    wait_stack(cf, stack["StackId"], "DELETE", seen, waiting)
