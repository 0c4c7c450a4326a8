"""A planning deadline: the time limit a user gave, checked by every long loop."""

from __future__ import annotations

import time
from dataclasses import dataclass


class DeadlinePassed(RuntimeError):
    """Planning ran past its time limit; the message says which step and how far it got."""


@dataclass(frozen=True)
class Deadline:
    """`limit_s` seconds from when it was made (monotonic clock)."""

    at: float
    limit_s: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds, seconds)

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def check(self, doing: str) -> None:
        """DeadlinePassed if the time is up; `doing` says what was under way."""
        if time.monotonic() > self.at:
            raise DeadlinePassed(f"{doing} did not finish within the {self.limit_s:g} s time limit")
