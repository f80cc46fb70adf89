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
    """One line for a disk-full, read-only or permission-denied OSError: the folder and the cause; else None."""
    if not isinstance(error, OSError) or error.errno not in STORAGE_CAUSES:
        return None
    path = error.filename
    folder = path if path is None or Path(path).is_dir() else Path(path).parent
    return f"cannot write in {folder or 'a folder'}: {STORAGE_CAUSES[error.errno]}"
