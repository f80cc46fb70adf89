"""The Train job's entry point: compile the graphs the Neuron compile cache lacks, then train, in one job.

The training toolkit runs this script once per instance (the Train step names it as `sagemaker_program`); it starts
`torchrun ... train.py` through the toolkit's own launcher (`TorchDistributedRunner`, what `torch_distributed` runs:
one process per NeuronCore or GPU, the multi-node options, the EFA settings).

On Neuron with ``--backend xla`` and ``--compile-ahead true``, before training it looks in the compile cache
($NEURON_COMPILE_CACHE_URL, S3 or a folder) for the manifest of this run's graphs: ``manifests/<key>.json``, the key
a digest of what shapes them (GRAPH_ARGUMENTS, the world size, the instance type, train.py, the Neuron packages'
versions and the job's NEURON_CC_FLAGS; not the data, the schedule or the logging). Found: training starts at once.
Not found: the toolkit's documented compile pass runs first (RUN_NEURON_PARALLEL_COMPILE=1, so
`neuron_parallel_compile torchrun ... train.py --precompile True`: every graph of the run traced in a few steps,
the ones the cache lacks compiled in parallel), then the first instance writes the manifest, then training starts.
A failed pass writes none, so the next job compiles again. Everywhere else (CUDA, CPU) it only trains.

The first instance adds ``compile`` to training_stats.json: whether the pass ran and why, its seconds, and the
graphs (``MODULE_*`` entries) the cache gained during the pass and during training; torch_xla's compile_count
counts graphs loaded from the cache too, so `graphs_loaded` is the difference.

Written by hand: neither the toolkit nor Neuron's tools skip the trace pass when the cache already holds its graphs.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from importlib import metadata
from pathlib import Path

GRAPH_ARGUMENTS = ("model-id", "batch-size", "grad-accum", "max-length", "seed", "weight-decay", "bf16", "backend")
NEURON_PACKAGES = ("torch", "torch-xla", "torch-neuronx", "neuronx-cc", "libneuronxla", "transformers")
COMPILE_AHEAD = "--compile-ahead"  # this script's own argument, not passed on to train.py
MANIFESTS = "manifests"
STATS_FILE = "training_stats.json"
HERE = Path(__file__).resolve().parent


def options(argv: list[str]) -> dict[str, str]:
    """`--key value` pairs of a command line (the toolkit passes every hyperparameter so)."""
    return {argv[i][2:]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}


def split_arguments(argv: list[str]) -> tuple[bool, list[str]]:
    """(whether to compile ahead, the arguments for train.py): --compile-ahead is taken out."""
    if COMPILE_AHEAD not in argv:
        return False, argv
    i = argv.index(COMPILE_AHEAD)
    return argv[i + 1].lower() in ("true", "1"), argv[:i] + argv[i + 2:]


def package_versions() -> dict[str, str | None]:
    found = {}
    for name in NEURON_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def graph_inputs(train_arguments: list[str], world_size: int, instance_type: str, cc_flags: str) -> dict:
    """What shapes the run's graphs: the manifest's key is their digest."""
    given = options(train_arguments)
    model = Path(given.get("model-id", ""))
    config = model / "config.json"  # a model folder (a staged model's channel): its architecture, not its path
    return {
        "arguments": {name: given.get(name) for name in GRAPH_ARGUMENTS},
        "model_config_sha256": hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None,
        "world_size": world_size,
        "instance_type": instance_type,
        "train_py_sha256": hashlib.sha256((HERE / "train.py").read_bytes()).hexdigest(),
        "packages": package_versions(),
        "neuron_cc_flags": cc_flags,
    }


def graph_key(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]


class CompileCache:
    """The Neuron compile cache at an S3 URI or a folder: its manifests and how many compiled graphs it holds."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self.s3 = self.url.startswith("s3://")
        if self.s3:
            import boto3

            self.bucket, _, self.prefix = self.url.removeprefix("s3://").partition("/")
            self.client = boto3.client("s3")

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}".lstrip("/")

    def manifest(self, key: str) -> dict | None:
        name = f"{MANIFESTS}/{key}.json"
        try:
            if self.s3:
                body = self.client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read()
            else:
                body = (Path(self.url) / name).read_bytes()
        except Exception as e:  # absent (NoSuchKey, FileNotFoundError) or unreadable: compile
            if not (isinstance(e, FileNotFoundError) or "NoSuchKey" in type(e).__name__ + str(e)):
                print(f"launch: the manifest could not be read ({type(e).__name__}: {e}); compiling", flush=True)
            return None
        return json.loads(body)

    def write_manifest(self, key: str, manifest: dict) -> None:
        name, body = f"{MANIFESTS}/{key}.json", json.dumps(manifest, indent=2, sort_keys=True).encode()
        if self.s3:
            self.client.put_object(Bucket=self.bucket, Key=self._key(name), Body=body)
        else:
            (Path(self.url) / MANIFESTS).mkdir(parents=True, exist_ok=True)
            (Path(self.url) / name).write_bytes(body)

    def graphs(self) -> int:
        """The compiled graphs in the cache: Neuron's `neuronxcc-<version>/MODULE_<hash>.../model.neff` entries."""
        if not self.s3:
            return sum(1 for _ in Path(self.url).glob("neuronxcc-*/MODULE_*/model.neff"))
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(""))
        return sum(1 for page in pages for item in page.get("Contents", []) if item["Key"].endswith("/model.neff")
                   and "/MODULE_" in item["Key"])


def torchrun(arguments: list[str], compile_pass: bool) -> None:
    """`torchrun ... train.py ARGUMENTS` through the training toolkit's launcher; with `compile_pass`, under
    neuron_parallel_compile (the toolkit's RUN_NEURON_PARALLEL_COMPILE switch). Exits with train.py's code if it
    fails (143 after a SIGTERM checkpoint)."""
    from sagemaker_training import errors, runner

    if compile_pass:
        os.environ["RUN_NEURON_PARALLEL_COMPILE"] = "1"
    else:
        os.environ.pop("RUN_NEURON_PARALLEL_COMPILE", None)
    try:
        runner.get(runner.TorchDistributedRunnerType, "train.py", arguments, None).run(capture_error=False)
    except errors.ExecuteUserScriptError as e:
        sys.exit(int(e.return_code) if e.return_code.lstrip("-").isdigit() else 1)


def merge_stats(output_data_dir: str, compile_stats: dict) -> None:
    path = Path(output_data_dir) / STATS_FILE
    if path.is_file():
        stats = json.loads(path.read_text())
        stats["compile"] = {**compile_stats, "graphs_loaded": max(0, (stats.get("compile_count") or 0)
                                                                   - compile_stats["graphs_compiled_in_training"])}
        path.write_text(json.dumps(stats, indent=2))


def main(argv: list[str] | None = None) -> None:
    from sagemaker_training import environment

    compile_ahead, arguments = split_arguments(list(sys.argv[1:] if argv is None else argv))
    env = environment.Environment()
    neuron = int(env.num_neurons) > 0 and options(arguments).get("backend") == "xla"
    if not (neuron and compile_ahead):
        torchrun(arguments, compile_pass=False)
        return
    if not os.environ.get("NEURON_COMPILE_CACHE_URL"):  # the Train step always sets it; a bare job keeps no manifest
        print("launch: no NEURON_COMPILE_CACHE_URL, so no manifest to keep: train.py compiles as it goes", flush=True)
        torchrun(arguments, compile_pass=False)
        return
    cache = CompileCache(os.environ["NEURON_COMPILE_CACHE_URL"])
    processes = int(env.additional_framework_parameters.get("sagemaker_mpi_num_of_processes_per_host")
                    or env.num_neurons)
    inputs = graph_inputs(arguments, processes * len(env.hosts), env.current_instance_type,
                          os.environ.get("NEURON_CC_FLAGS", ""))
    key, leader = graph_key(inputs), env.current_host == env.hosts[0]
    found = cache.manifest(key)
    before = cache.graphs()
    started = time.time()
    if found:
        print(f"launch: manifest {key} found in the compile cache (written {found.get('written')}): no compile "
              "pass", flush=True)
        reason = "skipped: the cache holds this run's graphs (manifest found)"
    else:
        print(f"launch: no manifest {key} in the compile cache: compiling the run's graphs ahead", flush=True)
        torchrun([*arguments, "--precompile", "True"], compile_pass=True)
        reason = "ran: no manifest of this run's graphs in the cache"
    ahead_s, compiled = round(time.time() - started, 1), cache.graphs()
    if not found and leader:
        cache.write_manifest(key, {"key": key, "inputs": inputs, "graphs_compiled": compiled - before,
                                   "seconds": ahead_s, "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    torchrun(arguments, compile_pass=False)
    if leader:
        merge_stats(env.output_data_dir, {"ahead": reason, "key": key, "ahead_s": ahead_s,
                                          "graphs_compiled_ahead": compiled - before,
                                          "graphs_compiled_in_training": cache.graphs() - compiled})


if __name__ == "__main__":
    main()
