"""The base of every expected failure: the CLI prints its message as one line and exits 1 (config errors: 2)."""


class UserError(Exception):
    """An expected failure (bad input, a missing resource, an AWS refusal), said in one line."""


class ConfigError(UserError, ValueError):
    """A configuration problem, stated in one line: key, value and what was expected."""
