"""What a `plan check` fault run prints, as the tests of faults and restarts read it."""

from __future__ import annotations


def verdict_first(lines: list[str], verdict: str) -> str:
    """The line that starts with `verdict` (PASSED or FAILED), which must be within the
    first 5 of at most 20 lines."""
    assert len(lines) <= 20, "\n".join(lines)
    first = next(i for i, line in enumerate(lines) if line.startswith(("PASSED", "FAILED")))
    assert first < 5 and lines[first].startswith(verdict), "\n".join(lines)
    return lines[first]
