"""Resolve the CLI's MODEL argument into a model, its example inputs and an optional loss.

Accepted forms::

    gpt3-175b, llama3-70b, ...   a zoo preset (`plan models` lists them)
    gpt, llama, mixtral          a zoo family at the shape given by Megatron-style fields
    hf:path/to/config.json       a Hugging Face config, built by transformers on meta
    demo:NAME                    a built-in model from planner.models.demo.DEMOS
    path/to/file.py:function     a function in a Python file (path relative to the cwd)
    package.module:function      a function in an importable module

The function takes no arguments and returns ``(model, example_inputs)`` or
``(model, example_inputs, loss_fn)``. Zoo and Hugging Face models are built on the meta
device, traced at micro-batch 1, and can be rebuilt at another depth (`LoadedModel.build`)
so that one block per template is traced. Everything a user can get wrong raises
:class:`ModelSpecError` with one sentence naming the bad input and how to fix it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import traceback
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from planner.models.flags import flag_names

if TYPE_CHECKING:  # torch is imported only where a model is built: zoo plans need none
    import torch
    from torch import nn

__all__ = ["ACCEPTED_FORMS", "BuiltModel", "LoadedModel", "ModelSpecError", "load_model"]

ACCEPTED_FORMS = (
    "a preset (see `plan models`), gpt/llama/mixtral with shape flags, hf:path/to/config.json, "
    "demo:NAME, path/to/file.py:function or package.module:function"
)


class ModelSpecError(ValueError):
    """A MODEL argument that cannot be resolved; the message says what to change."""


class BuiltModel(NamedTuple):
    """A model with the inputs and loss of one training step."""

    model: nn.Module
    """The module to plan; called as ``model(*example_inputs)``."""
    example_inputs: tuple[Any, ...]
    """Positional inputs for one training step (always a tuple, even for one tensor)."""
    loss_fn: Callable[..., torch.Tensor] | None
    """``loss_fn(output, *example_inputs) -> scalar tensor``, where ``output`` is what
    ``model(*example_inputs)`` returned. ``None`` means the planner's default loss
    (the mean of the squared first output)."""


@dataclass
class LoadedModel:
    """A model ready to be traced, as resolved from a model spec; built on first use."""

    name: str
    """Short name for reports: the preset, demo or factory function's name."""
    build: Callable[[int | None], BuiltModel] = field(repr=False)
    """Builds the model; with an int, at that many repeated blocks (see `num_layers`)."""
    num_layers: int | None = None
    """Repeated blocks of the model when `build` can change their number, else None."""
    config: Any = None
    """The zoo TransformerConfig, or a Hugging Face model's config: transformers' own, or
    its fields as plain attributes where the file states its whole shape
    (`hf_shape.plain_config`)."""
    seq_length: int | None = None
    """Tokens per sequence of a Hugging Face model's example inputs (the config's
    default or --seq-length)."""
    hf_path: str | None = None
    """A Hugging Face model's config.json (or its folder), as given."""
    build_on: Callable[[int | None, str], BuiltModel] | None = field(default=None, repr=False)
    """`build` on another device ('cpu': real weights, each module's own initialisation,
    and token ids), for a zoo or hf: model, which `build` makes on the meta device."""

    @cached_property
    def built(self) -> BuiltModel:
        return self.build(None)

    @property
    def model(self) -> nn.Module:
        return self.built.model

    @property
    def example_inputs(self) -> tuple[Any, ...]:
        return self.built.example_inputs

    @property
    def loss_fn(self) -> Callable[..., torch.Tensor] | None:
        return self.built.loss_fn

    @property
    def on_meta(self) -> bool:
        """Whether the parameters are on the meta device (nothing allocated)."""
        return any(p.is_meta for p in self.model.parameters())


def load_model(spec: str, shape: dict[str, Any] | None = None) -> LoadedModel:
    """Resolve ``spec`` (one of :data:`ACCEPTED_FORMS`) into a :class:`LoadedModel`.

    `shape` holds TransformerConfig fields given on the command line (``num_layers``,
    ``seq_length``, ...); zoo models take them all, Hugging Face configs ``num_layers``
    and ``seq_length``, other forms none.
    """
    shape = {k: v for k, v in (shape or {}).items() if v is not None}
    if spec.startswith("hf:"):
        return _load_hf(spec.removeprefix("hf:"), shape)
    if ":" not in spec:
        return _load_zoo(spec, shape)
    if shape:
        flags = flag_names(shape)
        raise ModelSpecError(
            f"{flags} only apply to zoo and hf: models; {spec!r} builds its own model, so "
            "change its shape in the factory."
        )
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
    return _eager(_from_factory_result(_call_factory(factory, spec), spec), func_name)


def _call_factory(factory: Callable[[], Any], spec: str) -> Any:
    """`factory()`, with anything it raises reported as the factory's error at the line of
    the user's code that raised it (the deepest frame in the factory's own file)."""
    try:
        return factory()
    except SystemExit as exit_:
        # A factory that exits (a script's main guard run by mistake, say) must not end
        # Tessel with its code, or with 0 as if all went well.
        raise ModelSpecError(
            f"{spec!r} called sys.exit({exit_.code!r}) instead of returning (model, "
            "example_inputs); make the function return them.") from None
    except Exception as error:
        frames = traceback.extract_tb(error.__traceback__)
        home = inspect.getsourcefile(factory)
        own = [f for f in frames if home and f.filename == home] or frames[-1:]
        where = f" at {Path(own[-1].filename).name}:{own[-1].lineno}" if own else ""
        message = " ".join(str(error).split())
        raise ModelSpecError(
            f"{spec!r} raised {type(error).__name__}{where}: {message}; fix the factory."
        ) from error


def _load_demo(name: str) -> LoadedModel:
    from planner.models.demo import DEMOS

    if name not in DEMOS:
        known = ", ".join(sorted(DEMOS))
        raise ModelSpecError(f"Unknown demo {name!r}; known demos: {known} (use demo:NAME).")
    return _eager(_from_factory_result(DEMOS[name](), f"demo:{name}"), name)


def _eager(built: BuiltModel, name: str) -> LoadedModel:
    return LoadedModel(name=name, build=lambda depth: built)


def _load_zoo(name: str, shape: dict[str, Any]) -> LoadedModel:
    from planner.models.presets import FAMILIES, PRESETS, zoo_config

    if name not in PRESETS and name not in FAMILIES and name.endswith(".py"):
        raise ModelSpecError(
            f"Model spec {name!r} has no ':'; name the factory function as {name}:function."
        )
    try:
        config = zoo_config(name, shape)
    except ValueError as error:
        # A suggestion is the likely fix; without one, list the other ways to name a model.
        helpful = name in PRESETS or name in FAMILIES or "did you mean" in str(error)
        message = str(error)
        for given in shape:  # the fields the command line set, named as typed
            message = re.sub(rf"\b{given}\b", flag_names([given]), message)
        raise ModelSpecError(
            message if helpful else f"{message} Other forms: {ACCEPTED_FORMS}."
        ) from None

    def build_on(depth: int | None, device: str) -> BuiltModel:
        from planner.models.transformer import build_model, example_inputs

        sized = config if depth is None else config.model_copy(update={"num_layers": depth})
        return BuiltModel(build_model(sized, device),
                          (example_inputs(sized, batch_size=1, device=device),), None)

    return LoadedModel(name=name, build=lambda depth: build_on(depth, "meta"),
                       num_layers=config.num_layers, config=config, build_on=build_on)


def with_weights(loaded: LoadedModel, seed: int = 0) -> LoadedModel | None:
    """A zoo or hf: model built on the CPU with real weights (each module's own
    initialisation, drawn after `torch.manual_seed(seed)`) and token ids, at any depth, so
    that it can train; None for other models."""
    if loaded.build_on is None:
        return None
    build_on = loaded.build_on

    def build(depth: int | None) -> BuiltModel:
        import torch

        torch.manual_seed(seed)
        return build_on(depth, "cpu")

    return replace(loaded, build=build)


def _load_hf(path: str, shape: dict[str, Any]) -> LoadedModel:
    from planner.models import hf_shape

    unknown = sorted(set(shape) - {"num_layers", "seq_length"})
    if unknown:
        flags = flag_names(unknown)
        raise ModelSpecError(
            f"{flags} cannot change a Hugging Face model; edit {path} instead (only "
            "--num-layers and --seq-length apply to hf: models)."
        )
    # A config that states its whole shape is read as it is (no torch: training plans
    # only price the shape); any other goes through transformers, which knows its
    # defaults and validates it. The model itself is always transformers' config's.
    try:
        plain = hf_shape.plain_config(hf_shape.read_config_fields(path)[1])
    except hf_shape.HFConfigError as error:
        raise ModelSpecError(str(error)) from None
    config = plain or _transformers_config(path)
    uniform_depth = hf_shape.hf_num_layers(config)
    seq_length = shape.get("seq_length") or hf_shape.default_seq_length(config)
    vocab = getattr(config, "vocab_size", None) or 2

    def build_on(depth: int | None, device: str) -> BuiltModel:
        from planner.models import huggingface as hf

        try:
            model, loss = hf.build_hf_model(config if plain is None else _transformers_config(path),
                                            depth or shape.get("num_layers"), device)
        except hf.HFConfigError as error:
            raise ModelSpecError(str(error)) from None
        except Exception as error:  # noqa: BLE001 - transformers validates in many ways
            raise ModelSpecError(
                f"transformers could not build the model in {path} ({type(error).__name__}: "
                f"{str(error).splitlines()[0] if str(error) else ''}); fix the config."
            ) from None
        import torch

        tokens = torch.randint(0, vocab, (1, seq_length), device=device)
        return BuiltModel(model, (tokens,), loss)

    name = Path(path).parent.name if Path(path).name == "config.json" else Path(path).name
    return LoadedModel(
        name=f"hf:{name or path}",
        build=lambda depth: build_on(depth, "meta"),
        build_on=build_on,
        num_layers=uniform_depth and shape.get("num_layers", uniform_depth),
        config=config,
        seq_length=seq_length,
        hf_path=path,
    )


def _transformers_config(path: str) -> Any:
    from planner.models import huggingface as hf

    try:
        return hf.load_hf_config(path)
    except hf.HFConfigError as error:
        raise ModelSpecError(str(error)) from None


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


def _from_factory_result(result: Any, spec: str) -> BuiltModel:
    """Check a factory's return value and normalize it (a lone tensor becomes a 1-tuple)."""
    expected = (
        "expected (model, example_inputs) or (model, example_inputs, loss_fn) "
        "with model an nn.Module, example_inputs a tensor or tuple, loss_fn callable"
    )
    if not isinstance(result, (tuple, list)) or len(result) not in (2, 3):
        raise ModelSpecError(f"{spec!r} returned {_describe_result(result)}; {expected}.")
    import torch
    from torch import nn

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
        return BuiltModel(model, inputs, loss_fn)
    raise ModelSpecError(f"{spec!r} returned {wrong}; {expected}.")


def _describe_result(value: Any) -> str:
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of length {len(value)}"
    return type(value).__name__
