"""Serving targets: which serving stack an endpoint's instance type gets (docs/serving-targets.md). The config checks
deploy's instance types with it; the deploy Lambda and the local lifecycle read from it what a version's endpoint
must show."""

from __future__ import annotations

import re

# Which serving stack an instance family gets (docs/serving-targets.md): the CPU inference DLC on x86 CPU families,
# its GPU build on GPU families. Graviton (ARM) families are refused: the x86 image cannot run there.
SERVING_FAMILIES = {"cpu": "ml.c*, ml.m*, ml.r*, ml.t* (x86)", "gpu": "ml.g*, ml.p*"}
DEVICES = {"cpu": "cpu", "gpu": "cuda"}  # the torch device the handler serves on, per target
# what each target's inference specification in the Model Registry lists (the configured types come first)
SPEC_INSTANCE_TYPES = {"cpu": ("ml.c5.xlarge", "ml.c5.2xlarge", "ml.c6i.xlarge", "ml.m5.xlarge"),
                       "gpu": ("ml.g5.xlarge", "ml.g5.2xlarge", "ml.g4dn.xlarge", "ml.g6.xlarge")}
GRAVITON = re.compile(r"^[cmrt]\d+g")  # c6g, m7gd, r6g, t4g: ARM


def serving_target(instance_type: str, field: str = "deploy.instance_type") -> str:
    """The serving stack of `instance_type`: "cpu" or "gpu"; a ValueError naming `field` and the supported families
    for any other (Graviton, Inferentia, Trainium, ...)."""
    family = instance_type.split(".")[1] if instance_type.count(".") >= 2 else ""
    supported = "; ".join(f"{target}: {families}" for target, families in SERVING_FAMILIES.items())
    if GRAVITON.match(family):
        raise ValueError(f"{field}={instance_type}: a Graviton (ARM) instance, which the x86 inference image cannot "
                         f"run on; expected one of {supported}")
    if family[:1] in "cmrt" and family[1:2].isdigit():
        return "cpu"
    if family[:1] in "gp" and family[1:2].isdigit():
        return "gpu"
    why = (" (Inferentia2 needs a model compiled for Neuron, which the pipeline does not build yet)"
           if family.startswith("inf") else "")
    raise ValueError(f"{field}={instance_type}: no serving stack for this instance family{why}; expected one of "
                     f"{supported}")
