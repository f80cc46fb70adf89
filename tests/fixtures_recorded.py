"""Recorded SageMaker responses for what moto lacks, played through botocore's own parser.

moto does not fill BillableTimeInSeconds and has no ListPipelineExecutionSteps. `recorded_sagemaker()` answers
those operations from `tests/recorded/<Operation>/<key>.json` (the JSON body the service sends, epoch
timestamps) with a `before-call` hook, the one botocore's Stubber uses, so moto never sees those calls; the
recorded body is parsed by botocore's own parser for the operation's output shape, exactly as a live response
is, so the code under test gets boto3's response shape (datetimes included). Anything not recorded falls
through to moto. The hook is installed for every client created while the context is open, so the CLI's own
`Aws` clients see it too.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import botocore.handlers
from botocore.awsrequest import AWSResponse
from botocore.parsers import create_parser

RECORDED = Path(__file__).resolve().parent / "recorded"
KEYS = {
    "DescribeTrainingJob": lambda body: body["TrainingJobName"].lower(),
    "DescribeProcessingJob": lambda body: body["ProcessingJobName"].lower(),
    "ListPipelineExecutionSteps": lambda body: body["PipelineExecutionArn"].rsplit("/", 1)[-1],
}


class _Body:
    """The raw stream botocore reads a response body from."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, **kwargs) -> Iterator[bytes]:
        yield self.data

    def read(self, *args, **kwargs) -> bytes:
        return self.data


class Recorder:
    """Serves recorded bodies by operation and key; remembers what it served."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        self.served: list[tuple[str, str]] = []

    def alias(self, key: str, recorded_key: str) -> None:
        """Answer requests for `key` (e.g. moto's random execution id) with the recording of `recorded_key`."""
        self.aliases[key] = recorded_key

    def __call__(self, model, params: dict, **kwargs) -> tuple[AWSResponse, dict] | None:
        operation = model.name
        key = KEYS[operation](json.loads(params.get("body") or b"{}"))
        path = RECORDED / operation / f"{self.aliases.get(key, key)}.json"
        if not path.exists():
            return None  # not recorded: moto answers
        self.served.append((operation, key))
        return respond(model, path.read_bytes(), params.get("url", ""))


def respond(model, body: bytes, url: str = "") -> tuple[AWSResponse, dict]:
    """A 200 answer to operation `model` with the JSON `body`, parsed by botocore's own parser for its output."""
    headers = {"Content-Type": "application/x-amz-json-1.1", "x-amzn-RequestId": "recorded"}
    parsed = create_parser(model.metadata["protocol"]).parse(
        {"body": body, "headers": headers, "status_code": 200}, model.output_shape
    )
    return AWSResponse(url, 200, headers, _Body(body)), parsed


@contextlib.contextmanager
def before_call(operations: Iterable[str], hook: Callable) -> Iterator[None]:
    """`hook` sees these SageMaker operations first (after botocore validated and serialized the request), for every
    client created inside the block; what it returns is the answer, None lets the call go on (to moto)."""
    handlers = [(f"before-call.sagemaker.{operation}", hook) for operation in operations]
    for handler in handlers:
        botocore.handlers.BUILTIN_HANDLERS.insert(0, handler)
    try:
        yield
    finally:
        for handler in handlers:
            botocore.handlers.BUILTIN_HANDLERS.remove(handler)


@contextlib.contextmanager
def recorded_sagemaker() -> Iterator[Recorder]:
    """Serve the recorded responses to every SageMaker client created inside the block."""
    recorder = Recorder()
    with before_call(KEYS, recorder):
        yield recorder


ROOT = Path(__file__).resolve().parent.parent
BUCKET = "test-pipeline-bucket"


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run the CLI in-process with the shipped config and the test bucket; return (exit code, stdout, stderr)."""
    import sys

    from pipeline import cli as module

    argv, width = sys.argv, module.console.width
    sys.argv = ["trainium-pipeline", "--config", str(ROOT / "pipeline.yaml"), "--set", f"aws.bucket={BUCKET}", *args]
    module.console.width = 250  # wide tables stay on one line each
    try:
        module.main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
        module.console.width = width
    out, err = capsys.readouterr()
    return code, out, err


def stats_tarball(stats: dict) -> bytes:
    """An output.tar.gz as the training toolkit packs SM_OUTPUT_DATA_DIR: training_stats.json at the root."""
    import io
    import tarfile

    data = json.dumps(stats, indent=2).encode()
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        info = tarfile.TarInfo("training_stats.json")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


def train_stats(
    samples: int, seconds: float, loss: float, accuracy: float, device: str = "xla", test_accuracy: float | None = None
) -> dict:
    """training_stats.json as train.py writes it."""
    return {
        "device": device,
        "world_size": 32,
        "bf16": True,
        "precompile": False,
        "steps": 1000,
        "global_step": 1000,
        "resumed_from_step": None,
        "samples": samples,
        "wall_time_s": seconds,
        "samples_per_sec": samples / seconds,
        "tokens_per_sec": samples * 71.3 / seconds,
        "padding_efficiency": 0.93,
        "train_loss": loss,
        "val_accuracy": accuracy,
        "test_accuracy": test_accuracy,
        "compile_count": 9 if device == "xla" else None,
        "compile_count_per_epoch": [9] if device == "xla" else None,
        "length_buckets": [32, 64, 128] if device == "xla" else None,
    }
