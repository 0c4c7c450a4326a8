"""The console every command prints to (rich; no emoji, so ':' in names stays as typed)."""

from rich.console import Console

console = Console(emoji=False)
