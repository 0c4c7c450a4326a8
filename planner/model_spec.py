"""Resolve the CLI's MODEL argument into a model, its example inputs and an optional loss.

Accepted forms::

    demo:NAME                    a built-in model from planner.models.demo.DEMOS
    path/to/file.py:function     a function in a Python file (path relative to the cwd)
    package.module:function      a function in an importable module

The function takes no arguments and returns ``(model, example_inputs)`` or
``(model, example_inputs, loss_fn)``. Everything a user can get wrong raises
:class:`ModelSpecError` with one sentence naming the bad input and how to fix it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch
from torch import nn

from planner.models.demo import DEMOS

__all__ = ["LoadedModel", "ModelSpecError", "load_model", "ACCEPTED_FORMS"]

ACCEPTED_FORMS = "demo:NAME, path/to/file.py:function or package.module:function"


class ModelSpecError(ValueError):
    """A MODEL argument that cannot be resolved; the message says what to change."""


@dataclass
class LoadedModel:
    """A model ready to be traced, as resolved from a model spec."""

    model: nn.Module
    """The module to plan; called as ``model(*example_inputs)``."""

    example_inputs: tuple[Any, ...]
    """Positional inputs for one training step (always a tuple, even for one tensor)."""

    loss_fn: Callable[..., torch.Tensor] | None = None
    """``loss_fn(output, *example_inputs) -> scalar tensor``, where ``output`` is what
    ``model(*example_inputs)`` returned. ``None`` means the planner's default loss
    (the mean of the squared first output)."""

    name: str = ""
    """Short name for reports: the demo name or the factory function's name."""


def load_model(spec: str) -> LoadedModel:
    """Resolve ``spec`` (one of :data:`ACCEPTED_FORMS`) into a :class:`LoadedModel`."""
    if ":" not in spec:
        raise ModelSpecError(f"Model spec {spec!r} has no ':'; use one of {ACCEPTED_FORMS}.")
    # Split on the last ':' so Windows drive letters (C:\...) stay part of the path.
    target, func_name = spec.rsplit(":", 1)
    if not target or not func_name:
        raise ModelSpecError(
            f"Model spec {spec!r} is missing a part on one side of ':'; "
            f"use one of {ACCEPTED_FORMS}."
        )

    if target == "demo":
        return _load_demo(func_name)

    if _looks_like_path(target):
        module = _import_file(target, spec)
    else:
        module = _import_module(target, spec)
    factory = _find_function(module, func_name, target)
    return _from_factory_result(factory(), spec, func_name)


def _load_demo(name: str) -> LoadedModel:
    if name not in DEMOS:
        known = ", ".join(sorted(DEMOS))
        raise ModelSpecError(f"Unknown demo {name!r}; known demos: {known} (use demo:NAME).")
    return _from_factory_result(DEMOS[name](), f"demo:{name}", name)


def _looks_like_path(target: str) -> bool:
    return target.endswith(".py") or "/" in target or os.sep in target


def _import_file(target: str, spec: str) -> ModuleType:
    """Import a .py file by path, under a private module name."""
    path = Path(target).expanduser()
    if not path.is_file():
        raise ModelSpecError(
            f"Model file {target!r} in spec {spec!r} does not exist "
            f"(looked in {Path.cwd()}); check the path, which is relative to the current directory."
        )
    # A name unique per resolved path: loading two files called model.py must not collide,
    # and registering the module in sys.modules lets dataclasses and pickling inside it work.
    digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    module_name = f"_tessel_model_{path.stem}_{digest}"
    import_spec = importlib.util.spec_from_file_location(module_name, path)
    if import_spec is None or import_spec.loader is None:
        raise ModelSpecError(f"Model file {target!r} is not a Python file; give a .py file.")
    module = importlib.util.module_from_spec(import_spec)
    sys.modules[module_name] = module
    try:
        import_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise ModelSpecError(
            f"Model file {target!r} failed to import ({type(exc).__name__}: {exc}); "
            "fix the error in that file."
        ) from exc
    return module


def _import_module(target: str, spec: str) -> ModuleType:
    try:
        return importlib.import_module(target)
    except Exception as exc:
        raise ModelSpecError(
            f"Module {target!r} in spec {spec!r} could not be imported "
            f"({type(exc).__name__}: {exc}); "
            "check the module name and that its package is on PYTHONPATH, "
            "or give a file path ending in .py."
        ) from exc


def _find_function(module: ModuleType, func_name: str, target: str) -> Callable[[], Any]:
    """Return ``module.func_name``, or say which functions the module does define."""
    factory = getattr(module, func_name, None)
    if callable(factory):
        return factory
    # Only functions defined in the module itself: imported helpers (torch.randn, ...)
    # would drown the names the user is looking for.
    defined = sorted(
        name
        for name, obj in vars(module).items()
        if inspect.isfunction(obj)
        and obj.__module__ == module.__name__
        and not name.startswith("_")
    )
    listing = ", ".join(defined) if defined else "none"
    raise ModelSpecError(
        f"{target!r} defines no function {func_name!r}; functions it defines: {listing}."
    )


def _from_factory_result(result: Any, spec: str, name: str) -> LoadedModel:
    """Check a factory's return value and normalize it (a lone tensor becomes a 1-tuple)."""
    expected = (
        "expected (model, example_inputs) or (model, example_inputs, loss_fn) "
        "with model an nn.Module, example_inputs a tensor or tuple, loss_fn callable"
    )
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise ModelSpecError(f"{spec!r} returned {_describe_result(result)}; {expected}.")
    model, inputs, *rest = result
    loss_fn = rest[0] if rest else None
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    elif isinstance(inputs, list):
        inputs = tuple(inputs)
    if not isinstance(model, nn.Module):
        wrong = f"a model of type {type(model).__name__}"
    elif not isinstance(inputs, tuple):
        wrong = f"example_inputs of type {type(inputs).__name__}"
    elif loss_fn is not None and not callable(loss_fn):
        wrong = f"a loss_fn of type {type(loss_fn).__name__}"
    else:
        return LoadedModel(model=model, example_inputs=inputs, loss_fn=loss_fn, name=name)
    raise ModelSpecError(f"{spec!r} returned {wrong}; {expected}.")


def _describe_result(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of length {len(value)}"
    return type(value).__name__
