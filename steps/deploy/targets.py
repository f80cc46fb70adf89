"""Serving targets: which serving stack an endpoint's instance type gets (docs/serving-targets.md). The config checks
deploy's instance types with it; the definition, the deploy Lambda and the local lifecycle read from it what a
version's endpoint runs and must show."""

from __future__ import annotations

import re

# Which serving stack an instance family gets (docs/serving-targets.md): the CPU inference DLC on x86 CPU families,
# its GPU build on GPU families, the Neuron build on Inferentia2. Graviton (ARM) families are refused: the x86 image
# cannot run there; Inferentia1 needs the older neuron-cc compiler, which no image here ships.
SERVING_FAMILIES = {"cpu": "ml.c*, ml.m*, ml.r*, ml.t* (x86)", "gpu": "ml.g*, ml.p*", "neuron": "ml.inf2.*"}
TARGET_NAMES = {"cpu": "CPU", "gpu": "GPU", "neuron": "Inferentia2"}
DEVICES = {"cpu": "cpu", "gpu": "cuda", "neuron": "neuron"}  # the device the handler serves on, per target
# what each target's inference specification in the Model Registry lists (the configured types come first)
SPEC_INSTANCE_TYPES = {"cpu": ("ml.c5.xlarge", "ml.c5.2xlarge", "ml.c6i.xlarge", "ml.m5.xlarge"),
                       "gpu": ("ml.g5.xlarge", "ml.g5.2xlarge", "ml.g4dn.xlarge", "ml.g6.xlarge"),
                       "neuron": ("ml.inf2.xlarge", "ml.inf2.8xlarge")}
# The endpoint test's p95 budget of one request per target, in ms (deploy.test.p95_ms overrides it): the CPU's
# covers a bert-base on a 4-vCPU instance with the container's overhead; an accelerator's model time is a few ms
# (published bert-base, sequence 128, batch 1: a p99 of 1.04 ms on inf2.xlarge by Neuron, a p95 of 18.92 ms fp32 and
# 11.52 ms fp16 on a T4 by NVIDIA; docs/serving-targets.md), so the rest of the budget is HTTP, JSON and tokenizing.
P95_MS = {"cpu": 500.0, "gpu": 100.0, "neuron": 100.0, "serverless": 1000.0}
# SageMaker Serverless Inference (deploy.serverless): the CPU image without instances, with this much memory (1 GB
# steps; its vCPUs grow with it) and up to 200 concurrent requests; its budget allows the smaller share of a CPU.
SERVERLESS_MEMORY_MB = (1024, 2048, 3072, 4096, 5120, 6144)
SERVERLESS_MAX_CONCURRENCY = 200
# How long an instance may take to pass its first health check (ContainerStartupHealthCheckTimeoutInSeconds): on
# Inferentia2 the handler compiles the model for Neuron when it starts (a bert-base takes minutes); None: SageMaker's
# default.
STARTUP_HEALTH_CHECK_S = {"cpu": None, "gpu": None, "neuron": 1800}
GRAVITON = re.compile(r"^[cmrt]\d+g")  # c6g, m7gd, r6g, t4g: ARM


def serving_target(instance_type: str, field: str = "deploy.instance_type") -> str:
    """The serving stack of `instance_type`: "cpu", "gpu" or "neuron"; a ValueError naming `field` and the supported
    families for any other (Graviton, Inferentia1, Trainium, ...)."""
    family = instance_type.split(".")[1] if instance_type.count(".") >= 2 else ""
    supported = "; ".join(f"{target}: {families}" for target, families in SERVING_FAMILIES.items())
    if GRAVITON.match(family):
        raise ValueError(f"{field}={instance_type}: a Graviton (ARM) instance, which the x86 inference image cannot "
                         f"run on; expected one of {supported}")
    if family[:1] in "cmrt" and family[1:2].isdigit():
        return "cpu"
    if family[:1] in "gp" and family[1:2].isdigit():
        return "gpu"
    if family == "inf2":
        return "neuron"
    why = (" (Inferentia1 needs the neuron-cc compiler, which the Neuron inference image does not ship: use ml.inf2)"
           if family == "inf1" else "")
    raise ValueError(f"{field}={instance_type}: no serving stack for this instance family{why}; expected one of "
                     f"{supported}")
