"""The base of every expected failure: the CLI prints its message as one line and exits 1 (config errors: 2)."""

import signal


class UserError(Exception):
    """An expected failure (bad input, a missing resource, an AWS refusal), said in one line."""


class ConfigError(UserError, ValueError):
    """A configuration problem, stated in one line: key, value and what was expected."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread so that a command stops as it does on Ctrl-C."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")
