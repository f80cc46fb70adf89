"""Where the pipeline runs, behind one protocol: SageMaker (pipeline.sagemaker) or this machine (pipeline.local).

The CLI reads the config, calls a backend and hands the records it returns (pipeline.records) to pipeline.views;
it never asks which backend it has.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pipeline.records import Approval, Changes, ExecutionView, OnUpdate, RunSummary, StageView, Upserted, VersionView

if TYPE_CHECKING:
    from pipeline.config import Config
    from pipeline.cost import ExecutionCost
    from pipeline.dag.selection import Selection


class Backend(Protocol):
    """What the CLI can do with a pipeline, wherever it runs."""

    cfg: Config

    def check(self, parameters: dict[str, str]) -> None:
        """Raise ParameterError for parameters the definition would refuse, before anything is changed."""

    def upsert(self) -> Upserted: ...

    def start(
        self, parameters: dict[str, str], *, wait: bool, use_cache: bool, on_update: OnUpdate, poll: float
    ) -> ExecutionView: ...

    def check_selection(self, steps: list[str], source: str | None, parameters: dict[str, str]) -> Selection:
        """The selection of `steps` with outputs from execution `source`, checked against the definition of the config
        (SelectionError, ParameterError); nothing is started or changed."""

    def start_selected(
        self, steps: list[str], source: str | None, parameters: dict[str, str], *, wait: bool, use_cache: bool,
        on_update: OnUpdate, poll: float,
    ) -> ExecutionView:
        """Run only `steps` of the upserted pipeline; the unselected steps they depend on keep the outputs they had in
        execution `source`, whose parameters are the defaults of `parameters`."""

    def retry(self, execution: str | None, *, wait: bool, on_update: OnUpdate, poll: float) -> ExecutionView:
        """Run a Failed or Stopped execution (default: the latest) again in place: the steps that succeeded keep their
        outputs, the others run again. Refused when the code and config make another definition than it ran."""

    def execution(self, execution: str | None) -> ExecutionView: ...

    def executions(self, limit: int) -> list[ExecutionView]: ...

    def summary(self, execution: ExecutionView) -> RunSummary: ...

    def versions(self, status: str | None) -> list[VersionView]: ...

    def describe_version(self, version: int) -> dict: ...

    def set_status(self, version: int, status: str, note: str) -> Approval:
        """Approve (to staging, tested there), reject or reset a version (a rollback where it was served)."""

    def deploy(self, version: int) -> Changes:
        """Send an Approved version to the staging endpoint and test it there."""

    def promote(self, version: int) -> Changes:
        """Send a version whose staging test passed to production; refused with the reason otherwise."""

    def endpoints(self) -> list[StageView]:
        """The staging and production endpoints: version, status, instances, scaling, last test."""

    def serve(self, version: int | None, port: int | None, on_ready: Callable[[str, VersionView], None]) -> None:
        """Serve a version (default: the latest Approved) on 127.0.0.1 in the foreground until Ctrl-C."""

    def stop_endpoint(self) -> bool:
        """Stop the endpoints left running in the background; False when none was running."""

    def cost(self, execution: str | None) -> ExecutionCost: ...


def open_backend(cfg: Config, local: bool, root: Path | None = None) -> Backend:
    """The local backend (rooted at `root`, default local.root; `cfg` its local profile) or SageMaker's."""
    if local:
        from pipeline.local.backend import LocalBackend

        return LocalBackend(cfg, root)
    from pipeline.sagemaker.backend import SageMakerBackend

    return SageMakerBackend(cfg)
