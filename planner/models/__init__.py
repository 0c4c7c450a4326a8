"""Built-in reference models used by the CLI (``plan demo:NAME``), docs and tests."""
