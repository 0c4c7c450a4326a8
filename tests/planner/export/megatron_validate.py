"""Megatron-LM's own `parse_args` and `validate_args` on launch lines, in a process of its
own (Megatron-LM keeps global state and prints every argument).

Reads JSON from stdin: a list of {"argv": [...], "env": {...}}; prints one JSON list of
{"ok": bool, "error": str, "world_size": int, "data_parallel_size": int}.

Three things stand in for a GPU machine, each needed only to read arguments on a CPU:
- `WORLD_SIZE` (torchrun sets it) and the script's own exports are in the environment;
- `get_device_arch_version` and `torch.cuda.get_device_capability` (CUDA device queries;
  the latter for --moe-grouped-gemm's check) answer 9, a Hopper GPU;
- the two Python 3.12 names megatron-core 0.17+ imports exist on 3.11 (`typing.override`
  from typing_extensions) and its triton kernels for MoE paged stashing, which nothing in
  argument handling calls, are not compiled (triton is a GPU package).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import types
import typing


def _stand_ins() -> None:
    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override  # type: ignore[attr-defined]
    kernels = types.ModuleType("megatron.core.transformer.moe.ops.paged_stash")
    kernels.GLOBAL_BLOCK_SIZE = 1024  # type: ignore[attr-defined]
    kernels.paged_stash_copy_kernel = kernels.paged_stash_pop_kernel = None  # type: ignore
    sys.modules.setdefault(kernels.__name__, kernels)


def validate(argv: list[str], env: dict[str, str]) -> dict:
    import megatron.training.arguments as arguments

    arguments.get_device_arch_version = lambda: 9
    arguments.torch.cuda.get_device_capability = lambda *device: (9, 0)
    saved = dict(os.environ)
    os.environ.update(env)
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(sys.stderr):
            args = arguments.parse_args()
            arguments.validate_args(args)
        return {"ok": True, "error": "", "world_size": args.world_size,
                "data_parallel_size": args.data_parallel_size}
    except (AssertionError, ValueError, SystemExit) as error:
        return {"ok": False, "error": f"{type(error).__name__}: {error}", "world_size": 0,
                "data_parallel_size": 0}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def main() -> None:
    _stand_ins()
    requests = json.load(sys.stdin)
    results = [validate(request["argv"], request["env"]) for request in requests]
    print(json.dumps(results))


if __name__ == "__main__":
    main()
