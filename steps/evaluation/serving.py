"""The endpoint's ONNX Runtime variants and the serving artifact that carries them (used by evaluate.py).

`build()` exports the trained classifier with `torch.onnx.export` (eager attention, dynamic batch and sequence axes,
opset 17), fuses it with ONNX Runtime's transformer optimizer (embeddings + LayerNorm, attention, bias + GELU and
skip + LayerNorm each become one kernel) and quantizes the fused graph dynamically to int8 (weights int8,
activations quantized per batch): onnx/model-fp32.onnx and onnx/model-int8.onnx, the files code/inference.py serves
with INFERENCE_RUNTIME=onnxruntime.

`vendor_runtime()` copies the onnxruntime that ran here into code/packages/: the evaluation runs on the serving
image, so the copy is built for its Python and platform, and the endpoint imports it when the image has none, with
nothing downloaded at container start and nothing the image ships changed. `pack()` writes model.tar.gz with the
files at the archive root, as SageMaker expects.

`python serving.py MODEL_DIR` adds both graphs and the runtime to an extracted model folder (CI serves the result
under the inference image's packages).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
import tarfile
import tempfile
import warnings
from pathlib import Path
from typing import Any

OPSET = 17
ONNX_DIR = "onnx"
PACKAGES_DIR = "code/packages"  # code/inference.py's PACKAGES_DIR


def unavailable() -> str | None:
    """Why the ONNX variants cannot be built here, or None when they can."""
    missing = [m for m in ("onnxruntime", "onnx") if importlib.util.find_spec(m) is None]
    return f"{' and '.join(missing)} not installed" if missing else None


def export(model_dir: Path, dest: Path) -> Path:
    """The classifier as an ONNX graph (inputs input_ids, attention_mask, token_type_ids; output logits)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    # eager attention: the graph the optimizer's attention fusion recognises (SDPA exports as unfused ops)
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    ids = torch.tensor([[2, 5, 6, 7, 8, 9, 10, 3], [2, 11, 12, 13, 3, 0, 0, 0]])
    mask = (ids > 0).long()
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # tracer warnings about shapes that the dynamic axes cover
        torch.onnx.export(model, (ids, mask, torch.zeros_like(ids)), str(dest), input_names=names,
                          output_names=["logits"], dynamic_axes={**axes, "logits": {0: "batch"}},
                          opset_version=OPSET, dynamo=False)
    return dest


def build(model_dir: Path) -> dict[str, Any]:
    """onnx/model-fp32.onnx (fused) and onnx/model-int8.onnx (fused, then int8) in model_dir; returns what was
    fused (operator counts) and the onnxruntime version."""
    import onnx
    import onnxruntime
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    out = model_dir / ONNX_DIR
    out.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        raw = export(model_dir, Path(scratch) / "exported.onnx")
        fused = optimize_model(str(raw), model_type="bert", num_heads=config.num_attention_heads,
                               hidden_size=config.hidden_size)
        fused.save_model_to_file(str(out / "model-fp32.onnx"))
    quantize_dynamic(str(out / "model-fp32.onnx"), str(out / "model-int8.onnx"), weight_type=QuantType.QInt8,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})  # for the fused ops' outputs
    counts = {op: n for op, n in fused.get_fused_operator_statistics().items() if n}
    return {"onnxruntime": onnxruntime.__version__, "opset": OPSET, "fused": counts}


def vendor_runtime(model_dir: Path) -> dict[str, str]:
    """Copy the onnxruntime package that runs here into model_dir/code/packages/; returns what was copied."""
    import onnxruntime

    source = Path(onnxruntime.__file__).parent
    dest = model_dir / PACKAGES_DIR / "onnxruntime"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return {"onnxruntime": onnxruntime.__version__, "python": f"{sys.version_info.major}.{sys.version_info.minor}",
            "platform": sys.platform}


def write_artifact(model_dir: Path, archive: Path | None, inference: dict[str, Any], onnx: dict[str, Any] | None,
                   dest: Path) -> None:
    """The serving model.tar.gz at dest: for a torch variant, the Train step's archive as it is (or model_dir
    without onnx/); for an ONNX Runtime variant, model_dir with that variant's graph and a copy of the runtime (its
    facts are added to `onnx`)."""
    graphs = {f"{ONNX_DIR}/{p.name}" for p in (model_dir / ONNX_DIR).glob("*.onnx")}
    if inference["runtime"] != "onnxruntime":
        if archive is None:
            pack(model_dir, dest, graphs)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(archive, dest)
        return
    onnx["packages"] = vendor_runtime(model_dir)
    pack(model_dir, dest, graphs - {f"{ONNX_DIR}/model-{inference['variant'].split('-')[1]}.onnx"})


def pack(model_dir: Path, archive: Path, leave_out: set[str] = frozenset()) -> Path:
    """model_dir as a model.tar.gz with its files at the archive root, without the relative paths in leave_out and
    without the bytecode that importing the handler here left beside it (compiled for this Python, not the image's)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz", compresslevel=6) as tar:
        for path in sorted(model_dir.rglob("*")):
            name = path.relative_to(model_dir).as_posix()
            if path.is_file() and name not in leave_out and "__pycache__" not in path.relative_to(model_dir).parts:
                tar.add(path, arcname=name)
    return archive


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Add the ONNX Runtime variants and the runtime to a model folder.")
    parser.add_argument("model_dir", type=Path, help="an extracted model.tar.gz (config.json, weights, code/)")
    model_dir = parser.parse_args(argv).model_dir
    facts = build(model_dir)
    print(json.dumps({**facts, "packages": vendor_runtime(model_dir)}))


if __name__ == "__main__":
    main()
