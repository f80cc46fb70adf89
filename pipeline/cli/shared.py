"""What the CLI's panels share: the two consoles, the global options (which typer keeps in `ctx.obj`), the options
several commands take, and how a command ends in failure (`run`)."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pipeline.backend import Backend, open_backend
from pipeline.config import Config, load_config
from pipeline.errors import ConfigError, Terminated, UserError, storage_fault

console = Console(soft_wrap=True)
errors = Console(stderr=True, soft_wrap=True)
debug = False  # the global --debug option: failures show their traceback
INTERRUPTED_EXIT = 130  # what Typer exits with, silently, when a command is interrupted (KeyboardInterrupt)

LOCAL = Annotated[bool, typer.Option("--local", help="On this machine: local runner, registry and endpoint.")]
ROOT = Annotated[Path | None, typer.Option(help="Folder of the local account (default local.root).")]
JSON = Annotated[bool, typer.Option("--json", help="Print the records as JSON (for scripts).")]
EXECUTION = Annotated[str | None, typer.Argument(help="Execution id or ARN (default: latest).")]


@dataclass(frozen=True)
class Options:
    """The global options: `--config FILE` and the `--set KEY=VALUE` overrides."""

    config: Path = Path("pipeline.yaml")
    sets: tuple[str, ...] = ()

    def load(self, local: bool = False) -> Config:
        """The config of --config with the TRAINIUM_PIPELINE_* environment and the --set overrides (`local`: its
        local profile, the one `--local` commands use)."""
        return load_config(self.config, self.sets, local=local)

    def backend(self, local: bool, root: Path | None = None) -> Backend:
        return open_backend(self.load(local), local, root)


def run(app: Callable[[], None]) -> None:
    """Run the CLI `app`. An expected error (UserError, or an OSError such as a port in use) prints one line and
    exits 1, a config error 2; SIGTERM and SIGHUP stop a command as Ctrl-C does (a running step is stopped), exit
    128 + the signal. With --debug any failure shows its traceback; without, an unexpected one is one line too."""
    global debug
    hangup = getattr(signal, "SIGHUP", None)  # not on Windows
    main = threading.current_thread() is threading.main_thread()
    signals = [s for s in (signal.SIGTERM, hangup) if s is not None] if main else []
    previous = {signum: signal.signal(signum, _terminate) for signum in signals}
    debug = False
    try:
        app()
    except SystemExit as exit_:
        interrupt = _interrupt_behind(exit_)
        if interrupt is None:
            raise
        if debug:
            raise interrupt from None
        sys.exit(_fail(interrupt))
    except (KeyboardInterrupt, Exception) as error:
        if debug:
            raise
        sys.exit(_fail(error))
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _interrupt_behind(exit_: SystemExit) -> KeyboardInterrupt | None:
    """The Ctrl-C or signal (Terminated) that Typer turned into a silent exit 130, if that is what `exit_` is."""
    if exit_.code != INTERRUPTED_EXIT:
        return None
    cause: BaseException | None = exit_
    while cause is not None and not isinstance(cause, KeyboardInterrupt):
        cause = cause.__cause__ or cause.__context__
    return cause


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signum, signal.SIG_DFL)  # a second one ends the process at once
    raise Terminated(signum)


def _fail(error: BaseException) -> int:
    """Say `error` in one line on stderr; the exit code."""
    text = " ".join(str(error).split())
    if isinstance(error, ConfigError):
        line, code = f"config error: {text}", 2
    elif isinstance(error, KeyboardInterrupt):
        line = f"interrupted ({text})" if text else "interrupted"
        code = 128 + (error.signum if isinstance(error, Terminated) else signal.SIGINT)
    elif fault := storage_fault(error):
        line, code = f"error: {fault}", 1
    elif isinstance(error, (UserError, OSError)):
        line, code = f"error: {text}", 1
    else:
        line, code = f"unexpected error {type(error).__name__}: {text} (rerun with --debug for the traceback)", 1
    errors.print(line, markup=False, highlight=False, soft_wrap=True)
    return code
