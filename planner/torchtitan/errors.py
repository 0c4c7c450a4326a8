"""The one error of a TorchTitan job config Tessel cannot read or predict."""

from __future__ import annotations


class JobConfigError(ValueError):
    """A job config Tessel cannot predict; the message names the file, the key and the
    fix."""
