"""The one error of a launch line Tessel cannot read or predict."""

from __future__ import annotations


class LaunchLineError(ValueError):
    """A launch line Tessel cannot predict; the message names the flag and the fix."""
