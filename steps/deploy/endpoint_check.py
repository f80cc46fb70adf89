"""The endpoint test: labelled test rows sent through the real invoke path of an endpoint, checked against the
evaluation.

Runs in the deploy Lambda (standard library; the caller passes a boto3 `sagemaker-runtime` client) and in the local
backend (the same client with `endpoint_url` set to the local endpoint). The rows come from `endpoint_sample.jsonl`,
which the Evaluate step writes next to evaluation.json: one JSON object per line, {"text", "label", "prediction"}
(and "text_pair", the content of a row with a title), a stratified sample of the test split with the evaluation's
own prediction of each row (0 negative, 1 positive).

`run()` sends each row as one request ({"inputs": [text]} or {"inputs": [{"text", "text_pair"}]}, as a client
would) and checks:
  * no error answer (a ModelError, a refused or unreadable answer, a connection error);
  * accuracy >= the evaluation's accuracy on the same rows - max_accuracy_drop;
  * p95 of the request latencies (measured by the caller: network and signing included) <= p95_budget_ms;
  * with `time_budget_s`, every row answered within it;
  * with `expected` (`expectation()` of the version's environment and evaluation): every answer reports, in its
    CustomAttributes (`inference-variant=<runtime>-<int8|fp32>`, set by training/inference.py), the variant that
    INFERENCE_RUNTIME / INFERENCE_QUANTIZE name (else the handler fell back: a corrupted or unloadable variant), and
    the p50 is at most `p50_factor` times the Evaluate step's one-row time of that variant plus `p50_overhead_ms`.
`metadata()` flattens the result into model package metadata (keys and values in the Model Registry's alphabet).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Iterable
from typing import Any

from steps.contract import SAMPLE_FILE, VARIANT_ATTRIBUTE

UNNAMED_LABELS = ("negative", "positive")  # the label ids 0 / 1 of a sample written before samples named labels
PREFIX = "staging_test"
METADATA_VALUE = re.compile(r"[^\w\s.:/=+\-@]", re.UNICODE)  # what UpdateModelPackage accepts in a value
MAX_VALUE = 256


class SampleError(ValueError):
    """The labelled sample is missing or malformed."""


def read_sample(lines: Iterable[str | bytes], source: str = SAMPLE_FILE) -> list[dict[str, Any]]:
    """The rows of an endpoint_sample.jsonl; SampleError naming the line of the first bad row."""
    rows = []
    for number, line in enumerate(lines, 1):
        text = line.decode("utf-8") if isinstance(line, bytes) else line
        if not text.strip():
            continue
        try:
            row = json.loads(text)
            row.update({key: _name(row[key]) for key in ("label", "prediction")})
            ok = isinstance(row["text"], str) and isinstance(row.get("text_pair", ""), str)
        except (ValueError, KeyError, TypeError, IndexError):
            ok = False
        if not ok:
            raise SampleError(f"{source} line {number}: expected {{\"text\": str, [\"text_pair\": str,] \"label\": "
                              f"NAME, \"prediction\": NAME}}, got {text.strip()[:80]!r}")
        rows.append(row)
    if not rows:
        raise SampleError(f"{source} holds no rows")
    return rows


def _name(label: Any) -> str:
    """A sample row's label as the endpoint answers it: its name (an old sample's 0 / 1: negative / positive)."""
    if isinstance(label, str) and label:
        return label
    if isinstance(label, int) and not isinstance(label, bool):
        return UNNAMED_LABELS[label]
    raise ValueError(f"label {label!r}")


def pick(rows: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """`count` rows keeping each label's share (the sample is already a seeded random draw: the first rows of each
    label in file order), in file order."""
    if count >= len(rows):
        return list(rows)
    chosen: set[int] = set()
    for label in dict.fromkeys(row["label"] for row in rows):
        index = [i for i, row in enumerate(rows) if row["label"] == label]
        chosen.update(index[: round(count * len(index) / len(rows))])
    return [row for i, row in enumerate(rows) if i in chosen]


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-th percentile (0 < q <= 100) of values."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def error_line(error: Exception) -> str:
    """An exception of a request as one line: botocore's error code and message, or the exception's type and text."""
    response = getattr(error, "response", None) or {}
    code = response.get("Error", {}).get("Code")
    message = response.get("Error", {}).get("Message") or str(error)
    return f"{code or type(error).__name__}: {' '.join(message.split())[:160]}"


def expectation(environment: dict[str, str], report: dict[str, Any], device: str = "cpu") -> dict[str, Any]:
    """What the endpoint of a version must show: the variant its environment names (None without
    INFERENCE_RUNTIME) and the Evaluate step's one-row p50 of it (None when not measured). On an accelerator
    Evaluate's CPU time says nothing of its latency: no p50 reference (the target's p95 budget still holds), and the
    variant is the device's: on a GPU (`device` cuda) torch-<INFERENCE_GPU_PRECISION>-cuda, whatever CPU variant the
    evaluation chose; on Inferentia2 (`device` neuron) neuron-<INFERENCE_NEURON_CAST>."""
    runtime = environment.get("INFERENCE_RUNTIME")
    if device == "neuron":
        return {"variant": f"neuron-{environment.get('INFERENCE_NEURON_CAST') or 'bf16'}", "p50_ms": None}
    if device != "cpu":
        return {"variant": f"torch-{environment.get('INFERENCE_GPU_PRECISION') or 'fp32'}-{device}", "p50_ms": None}
    if not runtime:
        return {"variant": None, "p50_ms": None}
    variant = f"{runtime}-{'int8' if environment.get('INFERENCE_QUANTIZE') == 'int8' else 'fp32'}"
    inference = report.get("inference") or {}
    p50 = inference.get("p50_ms") if inference.get("variant") == variant else None
    return {"variant": variant, "p50_ms": p50 if isinstance(p50, (int, float)) and p50 > 0 else None}


def served_variant(response: dict[str, Any]) -> str | None:
    """The variant an answer reports in its CustomAttributes (`inference-variant=...`), None without one."""
    for part in str(response.get("CustomAttributes") or "").split(","):
        key, _, value = part.strip().partition("=")
        if key == VARIANT_ATTRIBUTE:
            return value
    return None


def text_of(row: dict[str, Any]) -> str | dict[str, str]:
    """A sample row as one of a request's inputs: its text, or {"text", "text_pair"}."""
    return {"text": row["text"], "text_pair": row["text_pair"]} if "text_pair" in row else row["text"]


def _label(body: bytes) -> str:
    """The predicted label of a one-text answer [{"label": NAME, ...}]; ValueError for anything else."""
    answer = json.loads(body)
    if not isinstance(answer, list) or len(answer) != 1 or not isinstance(answer[0].get("label"), str):
        raise ValueError(f"unexpected answer {body[:120]!r}: expected [{{\"label\": NAME, \"score\": ...}}]")
    return answer[0]["label"]


def run(
    client: Any,
    endpoint: str,
    rows: list[dict[str, Any]],
    *,
    max_accuracy_drop: float,
    p95_budget_ms: float,
    clock: Callable[[], float] = time.perf_counter,
    expected: dict[str, Any] | None = None,
    p50_factor: float = 0.0,
    p50_overhead_ms: float = 0.0,
    time_budget_s: float | None = None,
) -> dict[str, Any]:
    """Send every row to `endpoint` through `client.invoke_endpoint` and check the answers (see the module). With
    `time_budget_s`, rows are sent only while that much time has not passed: a test that runs out of it fails
    (a hung or far too slow model), so a verdict is written before the caller's own time (the Lambda's) ends."""
    if not rows:
        return failed(endpoint, "no rows to send")
    rows = [{**row, "label": _name(row["label"]), "prediction": _name(row["prediction"])} for row in rows]
    latencies, correct, errors, first_error, served = [], 0, 0, "", set()
    began, sent = clock(), 0
    for row in rows:
        if time_budget_s is not None and clock() - began >= time_budget_s:
            break
        sent += 1
        started, problem = clock(), ""
        try:
            response = client.invoke_endpoint(
                EndpointName=endpoint, ContentType="application/json", Accept="application/json",
                Body=json.dumps({"inputs": [text_of(row)]}),
            )
            body = response["Body"].read()
            served.add(served_variant(response))
        except Exception as e:  # botocore's ClientError (ModelError, ValidationError) and connection errors
            problem = error_line(e)
        latencies.append((clock() - started) * 1000)
        if not problem:
            try:
                correct += _label(body) == row["label"]
            except ValueError as e:
                problem = str(e)
        if problem:
            errors += 1
            first_error = first_error or problem
    reference = sum(row["prediction"] == row["label"] for row in rows[:sent]) / max(sent, 1)
    accuracy = correct / max(sent, 1)
    p50, p95 = (percentile(latencies, 50), percentile(latencies, 95)) if latencies else (0.0, 0.0)
    failures = []
    if sent < len(rows):
        failures.append(f"out of time: {sent} of {len(rows)} rows answered within the test's {time_budget_s:.0f} s")
    if errors:
        failures.append(f"{errors} of {sent} requests got an error answer ({first_error})")
    if accuracy < reference - max_accuracy_drop - 1e-12:
        failures.append(f"accuracy {accuracy:.4f} is below the evaluation's {reference:.4f} on the same rows by more "
                        f"than {max_accuracy_drop:g}")
    if p95 > p95_budget_ms:
        failures.append(f"p95 latency {p95:.1f} ms is over the budget of {p95_budget_ms:g} ms")
    failures += _expected_failures(expected or {}, served, p50, p50_factor, p50_overhead_ms)
    reason = "; ".join(failures) or (
        f"accuracy {accuracy:.4f} (evaluation {reference:.4f}, allowed drop {max_accuracy_drop:g}), "
        f"p95 {p95:.1f} ms within {p95_budget_ms:g} ms, no error answer")
    return {
        "endpoint": endpoint, "rows": len(rows), "errors": errors, "accuracy": round(accuracy, 6),
        "reference_accuracy": round(reference, 6), "max_accuracy_drop": max_accuracy_drop,
        "p50_ms": round(p50, 2), "p95_ms": round(p95, 2), "p95_budget_ms": p95_budget_ms,
        "passed": not failures, "reason": reason,
    }


def _expected_failures(expected: dict[str, Any], served: set[str | None], p50: float, factor: float,
                       overhead: float) -> list[str]:
    """Where the endpoint does not serve the version's variant, or its p50 is over `factor` times the Evaluate
    step's one-row time plus `overhead` ms (HTTP, JSON, tokenizing, signing)."""
    failures, variant = [], expected.get("variant")
    if variant and served and served != {variant}:
        shown = ", ".join(sorted(v or "no variant reported" for v in served))
        failures.append(f"the endpoint serves {shown}, not the {variant} that the version's INFERENCE_RUNTIME / "
                        f"INFERENCE_QUANTIZE name (the handler fell back: see the endpoint's log)")
    reference = expected.get("p50_ms")
    if reference and factor and p50 > factor * reference + overhead:
        failures.append(f"p50 latency {p50:.1f} ms is over {factor:g} times the {reference:g} ms the Evaluate step "
                        f"measured for {variant} plus {overhead:g} ms")
    return failures


def failed(endpoint: str, reason: str) -> dict[str, Any]:
    """The result of a test that could not send anything (no sample, no endpoint)."""
    return {"endpoint": endpoint, "rows": 0, "errors": 0, "accuracy": None, "reference_accuracy": None,
            "p50_ms": None, "p95_ms": None, "passed": False, "reason": reason}


def clean(value: object) -> str:
    """`value` as a metadata value: characters outside the registry's alphabet become spaces, at most 256."""
    text = " ".join(METADATA_VALUE.sub(" ", str(value)).split())
    return (text or "-")[:MAX_VALUE]


def metadata(result: dict[str, Any], tested_at: str, version_label: str = "") -> dict[str, str]:
    """The result as flat model package metadata: staging_test=pass|fail and staging_test_<number>."""
    values = {PREFIX: "pass" if result["passed"] else "fail", f"{PREFIX}_at": tested_at,
              f"{PREFIX}_reason": result["reason"], f"{PREFIX}_endpoint": result["endpoint"]}
    for key in ("rows", "errors", "accuracy", "reference_accuracy", "p50_ms", "p95_ms"):
        if result.get(key) is not None:
            values[f"{PREFIX}_{key}"] = result[key]
    return {key: clean(value) for key, value in values.items()}


def from_metadata(values: dict[str, str]) -> dict[str, str]:
    """The staging test keys of a version's metadata, without their prefix ({} when it was never tested)."""
    return {key.removeprefix(PREFIX).lstrip("_") or "result": value
            for key, value in values.items() if key.startswith(PREFIX)}


def summary(result: dict[str, Any]) -> str:
    """One line: PASS or FAIL, the numbers, the reason."""
    verdict = "PASS" if result["passed"] else "FAIL"
    if not result.get("rows"):
        return f"{verdict}: {result['reason']}"
    return (f"{verdict} on {result['rows']} rows: accuracy {result['accuracy']:.4f} (evaluation "
            f"{result['reference_accuracy']:.4f}), p50 {result['p50_ms']:.1f} ms, p95 {result['p95_ms']:.1f} ms"
            + ("" if result["passed"] else f" - {result['reason']}"))


def last_test(values: dict[str, str]) -> str:
    """A version's staging test as one short line, from its metadata ("-" when never tested)."""
    test = from_metadata(values)
    if not test:
        return "-"
    if test.get("result") == "pass":
        return (f"pass: accuracy {test.get('accuracy', '?')} (evaluation {test.get('reference_accuracy', '?')}), "
                f"p95 {test.get('p95_ms', '?')} ms")
    return f"fail: {test.get('reason', 'no reason recorded')}"
