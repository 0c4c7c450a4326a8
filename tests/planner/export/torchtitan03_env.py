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

# Runs in TorchTitan 0.3's environment, once for many configs (its import is most of the
# time): ConfigManager on each job's --module/--config (and overrides), with the job's
# folder importable and the previous job's module forgotten; the fields the tests compare,
# or the last line of what it refused with, printed as one JSON list.
_PROBE = """
import dataclasses, importlib, json, sys, traceback
from torchtitan.config import ConfigManager
section = lambda s: {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
results = []
for folder, args in json.loads(sys.argv[1]):
    sys.path.insert(0, folder)
    for name in [m for m in sys.modules if m.split(".")[0] == args[args.index("--module") + 1]]:
        del sys.modules[name]
    importlib.invalidate_caches()
    try:
        config = ConfigManager().parse_args(args)
        results.append({
            "training": section(config.training), "parallelism": section(config.parallelism),
            "compile": section(config.compile),
            "activation_checkpoint": type(config.activation_checkpoint).__qualname__,
            "loss": type(config.loss).__qualname__,
            "model": [config.model_spec.name, config.model_spec.flavor],
            "hf_assets_path": config.hf_assets_path,
        })
    except BaseException as error:  # ConfigManager refuses by raising or exiting
        results.append({"error": (traceback.format_exception_only(error) or ["?"])[-1]})
    sys.path.remove(folder)
print(json.dumps(results, default=str))
"""


def source_root() -> Path:
    """The installed torchtitan 0.3.0 package folder, or a skip."""
    found = sorted(PYTHON.parent.parent.glob("lib/python*/site-packages/torchtitan"))
    if not found:
        pytest.skip(SKIP)
    return found[0]


def config_managers(jobs: list[tuple[Path, list[str]]]) -> list[dict[str, Any]]:
    """What TorchTitan 0.3's ConfigManager makes of each job's args (--module M --config F
    ...), with its folder importable, in one process: {"error": its last line} where it
    refuses. A skip where the environment is absent."""
    if not PYTHON.exists():
        pytest.skip(SKIP)
    done = subprocess.run(
        [str(PYTHON), "-c", _PROBE, json.dumps([[str(f), list(a)] for f, a in jobs])],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stderr.strip().splitlines() or ["?"])[-1]
    return json.loads(done.stdout.strip().splitlines()[-1])


def config_manager(folder: Path, *args: str) -> dict[str, Any]:
    """`config_managers` of one job; AssertionError with its last line when it refuses."""
    [built] = config_managers([(folder, list(args))])
    assert "error" not in built, built.get("error")
    return built
