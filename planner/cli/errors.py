"""Errors a user can act on, and the one handler that reports them."""


class UsageError(ValueError):
    """A command-line value that cannot be used; the message says what to change."""
