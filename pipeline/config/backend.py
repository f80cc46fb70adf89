"""The training section's choice of Neuron software path: PyTorch/XLA or TorchNeuron (native), and compiling ahead."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from pipeline.config.base import Section


class NeuronBackend(Section):
    """backend xla: PyTorch/XLA (torch-neuronx 2.9, the last XLA release; trn1/trn2); native: TorchNeuron, device
    "neuron" with torch.compile(backend="neuron") (public beta, trn2/trn3 only, an image the user names).
    compile_ahead (xla): the Train job first compiles, in parallel (neuron_parallel_compile), the graphs the compile
    cache lacks, unless the cache holds the manifest of this run's graphs (training/launch.py)."""

    backend: Literal["xla", "native"] = "xla"
    compile_ahead: bool = True

    @model_validator(mode="after")
    def _native_off_trn1(self) -> NeuronBackend:
        instance_type = getattr(self, "instance_type", "")
        if self.backend == "native" and instance_type.startswith(("ml.trn1.", "ml.trn1n.")):
            raise ValueError(f"training.backend=native: TorchNeuron runs on trn2/trn3 only, not "
                             f"training.instance_type={instance_type} (use backend xla there)")
        return self

    @property
    def compiles_ahead(self) -> bool:
        """Whether the Train job compiles its graphs ahead of training (the XLA backend only)."""
        return self.compile_ahead and self.backend == "xla"
