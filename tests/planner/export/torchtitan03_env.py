"""TorchTitan 0.3.0 for tests, from the environment of its own (.venv/torchtitan-0.3: its
pins would move this project's torch). Its config classes run there, in a subprocess; its
source is read from there by the tests of Tessel's tables. Absent: the tests skip, saying
how to create it:

    python3 -m venv .venv/torchtitan-0.3
    echo "$PWD/.venv/lib/python3.11/site-packages" \\
        > .venv/torchtitan-0.3/lib/python3.11/site-packages/tessel-main.pth
    .venv/torchtitan-0.3/bin/pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3 \\
        tyro docstring_parser typeguard torchdata tensorboard triton datasets \\
        multiprocess pyarrow dill xxhash

(--no-deps, with this project's torch 2.13.0 CPU seen through the .pth file: what
`import torchtitan.trainer` and its config registries need, nothing that moves torch.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
PYTHON = ROOT / ".venv" / "torchtitan-0.3" / "bin" / "python"
SKIP = "TorchTitan 0.3's environment .venv/torchtitan-0.3 is absent (see tests/planner/" \
       "export/torchtitan03_env.py to create it)"

# Runs in TorchTitan 0.3's environment: its ConfigManager on --module/--config (and
# overrides), the fields the tests compare printed as JSON.
_PROBE = """
import dataclasses, json, sys
sys.path.insert(0, sys.argv[1])
from torchtitan.config import ConfigManager
config = ConfigManager().parse_args(sys.argv[2:])
section = lambda s: {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
print(json.dumps({
    "training": section(config.training), "parallelism": section(config.parallelism),
    "compile": section(config.compile),
    "activation_checkpoint": type(config.activation_checkpoint).__qualname__,
    "loss": type(config.loss).__qualname__,
    "model": [config.model_spec.name, config.model_spec.flavor],
    "hf_assets_path": config.hf_assets_path,
}, default=str))
"""


def source_root() -> Path:
    """The installed torchtitan 0.3.0 package folder, or a skip."""
    found = sorted(PYTHON.parent.parent.glob("lib/python*/site-packages/torchtitan"))
    if not found:
        pytest.skip(SKIP)
    return found[0]


def config_manager(folder: Path, *args: str) -> dict[str, Any]:
    """What TorchTitan 0.3's ConfigManager makes of `args` (--module M --config F ...),
    with `folder` importable; AssertionError with its last line when it refuses."""
    if not PYTHON.exists():
        pytest.skip(SKIP)
    done = subprocess.run([str(PYTHON), "-c", _PROBE, str(folder), *args],
                          capture_output=True, text=True, timeout=300, cwd=folder)
    assert done.returncode == 0, (done.stderr.strip().splitlines() or ["?"])[-1]
    return json.loads(done.stdout.strip().splitlines()[-1])
