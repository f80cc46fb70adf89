"""A stand-in for the part of optimum-neuron 0.4.1's API that training/inference.py uses on Inferentia2, for the tests
of this machine, which has neither a Neuron device nor neuronx-cc (optimum-neuron does not import without
torch-neuronx and neuronx-distributed, published on Neuron's own package index only).

As optimum-neuron's NeuronModelForSequenceClassification (optimum/neuron/modeling.py, modeling_traced.py at 0.4.1):
`from_pretrained(dir, export=True, batch_size=, sequence_length=, auto_cast=, auto_cast_type=, ...)` compiles (here:
records the call in COMPILES and keeps the transformers model in fp32); `from_pretrained(dir)` loads a saved compiled
model, refusing a folder without a *.neuron file; `save_pretrained` writes config.json with a `neuron` section and
model.neuron; a forward pads its inputs to the compiled shapes (input_ids with the pad id, the others with 0),
refuses inputs over them, and removes the batch padding from the logits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification
from transformers.modeling_outputs import SequenceClassifierOutput

VERSION = "0.4.1"  # the optimum-neuron whose API this stands in for: the Neuron image's (tests/images/)
COMPILES: list[dict[str, Any]] = []  # the export calls: what neuronx-cc would have been asked to compile
EXPORT_ARGUMENTS = {"batch_size", "sequence_length", "auto_cast", "auto_cast_type", "disable_neuron_cache"}


class NeuronModelForSequenceClassification:
    def __init__(self, model: Any, shapes: dict[str, int]) -> None:
        self.model, self.shapes = model, shapes

    @classmethod
    def from_pretrained(cls, model_id: str, export: bool = False,
                        **kwargs: Any) -> NeuronModelForSequenceClassification:
        folder = Path(model_id)
        if export:
            unknown = set(kwargs) - EXPORT_ARGUMENTS
            assert not unknown, f"not an argument of optimum-neuron 0.4.1's export: {unknown}"
            COMPILES.append({"model_id": model_id, **kwargs})
            shapes = {"batch_size": kwargs["batch_size"], "sequence_length": kwargs["sequence_length"]}
        else:
            if not list(folder.glob("*.neuron")):
                raise FileNotFoundError(f"Could not find any neuron model file in {folder}")
            neuron = json.loads((folder / "config.json").read_text())["neuron"]
            shapes = {"batch_size": neuron["static_batch_size"], "sequence_length": neuron["static_sequence_length"]}
        return cls(AutoModelForSequenceClassification.from_pretrained(str(folder)).eval(), shapes)

    def save_pretrained(self, directory: str) -> None:
        self.model.save_pretrained(directory)
        config = json.loads((Path(directory) / "config.json").read_text())
        config["neuron"] = {"static_batch_size": self.shapes["batch_size"],
                            "static_sequence_length": self.shapes["sequence_length"]}
        (Path(directory) / "config.json").write_text(json.dumps(config))
        (Path(directory) / "model.neuron").write_bytes(b"a compiled graph")

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 token_type_ids: torch.Tensor | None = None) -> SequenceClassifierOutput:
        rows, width = input_ids.shape
        batch, length = self.shapes["batch_size"], self.shapes["sequence_length"]
        if rows > batch or width > length:
            raise ValueError(f"Unable to pad input_ids with shape: {tuple(input_ids.shape)}: the compiled shape is "
                             f"({batch}, {length})")
        pad_id = self.model.config.pad_token_id or 0

        def pad(tensor: torch.Tensor, value: int) -> torch.Tensor:
            tensor = torch.nn.functional.pad(tensor, (0, length - width), value=value)
            return torch.nn.functional.pad(tensor, (0, 0, 0, batch - rows), value=1)

        given = {"input_ids": pad(input_ids, pad_id), "attention_mask": pad(attention_mask, 0)}
        if token_type_ids is not None:
            given["token_type_ids"] = pad(token_type_ids, 0)
        return SequenceClassifierOutput(logits=self.model(**given).logits[:rows])
