"""The base of every expected failure: the CLI prints its message as one line and exits 1 (config errors: 2)."""

import errno
import signal
from pathlib import Path

STORAGE_CAUSES = {  # OSErrors of a folder that a user fixes, not bugs: the cause and what to do
    errno.ENOSPC: "the disk is full (free some space)",
    errno.EDQUOT: "the disk quota is exceeded (free some space)",
    errno.EROFS: "the file system is read-only (use a writable folder, e.g. --root)",
    errno.EACCES: "permission denied (check the folder's owner and mode)",
    errno.EPERM: "operation not permitted (check the folder's owner and mode)",
}


class UserError(Exception):
    """An expected failure (bad input, a missing resource, an AWS refusal), said in one line."""


class ConfigError(UserError, ValueError):
    """A configuration problem, stated in one line: key, value and what was expected."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised in the main thread so that a command stops as it does on Ctrl-C."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


def storage_fault(error: BaseException) -> str | None:
    """One line for a disk-full, read-only or permission-denied OSError: what could not be done where, and the
    cause; else None (a permission error that names no path says nothing more than its own message)."""
    if not isinstance(error, OSError) or error.errno not in STORAGE_CAUSES:
        return None
    cause, path = STORAGE_CAUSES[error.errno], error.filename
    if error.errno in (errno.EACCES, errno.EPERM):  # a read as much as a write
        return f"cannot access {path}: {cause}" if path else None
    if not path:
        return f"cannot write: {cause}"
    folder = path if Path(path).is_dir() else Path(path).parent
    return f"cannot write in {folder}: {cause}"
