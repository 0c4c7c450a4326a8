"""The one error of a launch line Tessel cannot read or predict."""

from __future__ import annotations


class LaunchLineError(ValueError):
    """A launch line Tessel cannot predict; the message names the flag and the fix."""

    def __init__(self, message: str, word: str | None = None) -> None:
        super().__init__(message)
        self.word = word
        """The word of the launch line it is about, when one is (to name its line)."""
