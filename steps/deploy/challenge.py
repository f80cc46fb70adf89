"""Champion/challenger: is a candidate that passed its staging test at least as good as the version in production, on
the same rows?

The rows are the candidate's endpoint sample (`endpoint_sample.jsonl`: Evaluate's seeded stratified sample of the
test split, with labels), up to deploy.challenge.rows of them. Staging (which serves the candidate) and production
are each sent the same rows, BATCH_ROWS texts a request, through the runtime client the endpoint test uses: both
models are scored as they serve, at the same time. Their outcomes on each row are paired:
  accuracy   the paired difference with its 95% interval (steps/paired.py, the interval Evaluate uses for int8);
  macro_f1   the macro-F1 difference with a seeded paired bootstrap interval.
The candidate passes when the interval's lower end is above -tolerance (it is not worse by more than the tolerance
with 95% confidence). The interval's width follows from the rows and how often the two models disagree: on 4,000
rows, two models that disagree on 4% of them get an accuracy interval of about +-0.006.

It is held for a person (never compared silently) when its label set differs from production's (the registry's
`label_digest`), or when the endpoints cannot be asked (an error answer, no sample, out of time, staging moved on);
`due` when production is being updated: compared once production is InService again. With nothing in production
there is nothing to beat. Standard library only (the deploy Lambda runs it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from steps import paired
from steps.contract import GATE_METRICS
from steps.deploy import endpoint_check

PREFIX = "challenge"  # the registry's metadata keys: challenge=pass|hold|due, challenge_<field>
PASS, HOLD, DUE = "pass", "hold", "due"
METRICS = tuple(GATE_METRICS)  # compared on the gate's metric
BATCH_ROWS = 32  # texts per request to production (the endpoint takes up to deploy.max_texts)
DIGEST = "label_digest"


def verdict(status: str, reason: str, champion: int | None = None, **numbers: Any) -> dict[str, Any]:
    return {"verdict": status, "reason": reason, "champion": champion, **numbers}


def ask(client: Any, endpoint: str, rows: list[dict[str, Any]], time_budget_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter) -> tuple[list[str], str]:
    """The labels `endpoint` answers for `rows`, in order, sent BATCH_ROWS at a time while `time_budget_s` lasts;
    and the first problem ("" for none: fewer labels than rows then means out of time)."""
    labels: list[str] = []
    began = clock()
    for start in range(0, len(rows), BATCH_ROWS):
        if time_budget_s is not None and clock() - began >= time_budget_s:
            break
        batch = rows[start:start + BATCH_ROWS]
        try:
            response = client.invoke_endpoint(
                EndpointName=endpoint, ContentType="application/json", Accept="application/json",
                Body=json.dumps({"inputs": [endpoint_check.text_of(row) for row in batch]}))
            answer = json.loads(response["Body"].read())
        except Exception as e:  # botocore's ClientError (ModelError, ValidationError), connection errors, bad JSON
            return labels, endpoint_check.error_line(e)
        if (not isinstance(answer, list) or len(answer) != len(batch)
                or not all(isinstance(a, dict) and isinstance(a.get("label"), str) for a in answer)):
            return labels, f"unexpected answer {json.dumps(answer)[:120]}: expected one {{\"label\": NAME}} per text"
        labels += [a["label"] for a in answer]
    return labels, ""


def compare(rows: list[dict[str, Any]], candidate: list[str], production: list[str], metric: str,
            tolerance: float, champion: int, seed: int = 0) -> dict[str, Any]:
    """The candidate's answers against production's on the first rows both answered (their labels in `rows`)."""
    n = min(len(candidate), len(production))
    labels, candidate, production = [row["label"] for row in rows[:n]], candidate[:n], production[:n]
    if metric == "macro_f1":
        difference, low, high = paired.macro_f1_difference(labels, candidate, production, seed)
    else:
        outcomes = [(a == y, b == y) for y, a, b in zip(labels, candidate, production, strict=True)]
        difference, low, high = paired.difference(sum(a and not b for a, b in outcomes),
                                                  sum(b and not a for a, b in outcomes), n)
    numbers = {"metric": metric, "rows": n, "difference": round(difference, 6), "low": round(low, 6),
               "high": round(high, 6), "tolerance": tolerance}
    shown = (f"scores {metric} {difference:+.4f} against production version {champion} on the same {n} rows "
             f"(95% interval {low:+.4f} to {high:+.4f})")
    if low > -tolerance:
        return verdict(PASS, f"{shown}: not worse by more than {tolerance:g}", champion, **numbers)
    return verdict(HOLD, f"{shown}: may be worse by more than {tolerance:g}, left for a person (promote N)",
                   champion, **numbers)


def metadata(result: dict[str, Any], at: str) -> dict[str, str]:
    """The verdict as flat model package metadata: challenge=pass|hold|due and challenge_<field>."""
    values = {PREFIX: result["verdict"], f"{PREFIX}_at": at, f"{PREFIX}_reason": result["reason"]}
    for key in ("champion", "metric", "rows", "difference", "low", "high"):
        if result.get(key) is not None:
            values[f"{PREFIX}_{key}"] = result[key]
    return {key: endpoint_check.clean(value) for key, value in values.items()}
