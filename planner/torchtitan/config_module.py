"""A TorchTitan 0.3 config module (`config_registry.py` style), read with `ast`, never run.

`plan predict --torchtitan my_runs.py:llama3_8b_tp2` reads the function as TorchTitan's
`ConfigManager` would call it (torchtitan/config/manager.py: `_load_config`), but by its
literals only: constants, lists, tuples, dicts, arithmetic on numbers, the names the
function assigns, and calls of the constructors a config is made of
(`Trainer.Config(parallelism=ParallelismConfig(tensor_parallel_degree=8), ...)`,
`model_registry("8B", converters=[...])`, `default_adamw(lr=3e-4)`, `FullAC.Config()`),
of another function of the same file, or of a registry function Tessel knows by name
(`config = llama3_8b()`); then attribute assignments
(`config.parallelism.context_parallel_degree = 4`) and the return. Anything else (a call
of an unknown function, an unknown name, a loop, an import used as a value) is refused in
one line naming the file, the line and the construct: nothing of the file is imported or
executed.

The result is the function's settings, in the form `registry.CONFIGS` holds them.
"""

from __future__ import annotations

import ast
import difflib
import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.torchtitan.errors import JobConfigError
from planner.torchtitan.job import read_named_file
from planner.torchtitan.next_keys import CHECKED_SECTIONS, CHECKPOINTING, FREE_SECTIONS, NEXT_KEYS
from planner.torchtitan.registry import CONFIGS

# Constructors of a checked section's config (torchtitan/config/configs.py).
SECTIONS = {"TrainingConfig": "training", "ParallelismConfig": "parallelism",
            "CompileConfig": "compile", "CommConfig": "comm", "DebugConfig": "debug"}
# Component configs whose fields change neither time nor memory (their Trainer.Config
# field: the section they fill).
FREE_CONSTRUCTORS = {
    "Profiler.Config": "profiler", "MetricsProcessor.Config": "metrics",
    "CheckpointManager.Config": "checkpoint", "Validator.Config": "validator",
    "LRSchedulersContainer.Config": "lr_scheduler", "HuggingFaceTokenizer.Config":
    "tokenizer", "HuggingFaceTextDataLoader.Config": "dataloader",
    "ChatDataLoader.Config": "dataloader",
}
LOSSES = ("ChunkedLossWrapper.Config", "CrossEntropyLoss.Config")
CONVERTERS = ("Float8LinearConverter", "MXFP8LinearConverter", "Float8GroupedExpertsConverter",
              "MXFP8GroupedExpertsConverter", "NVFP4LinearConverter", "LoRAConverter")
# model_registry's keyword arguments (torchtitan/models/<module>/__init__.py).
MODEL_ARGUMENTS = ("attn_backend", "converters", "num_mtp_layers", "moe_comm_backend",
                   "tp_gemm_backend", "non_blocking_capacity_factor")
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
               ast.FloorDiv: operator.floordiv, ast.Div: operator.truediv}


@dataclass
class _Section:
    """A section's config: its Trainer.Config field and the fields given."""

    name: str
    fields: dict[str, Any]
    kind: str | None = None  # the checkpointing policy, the loss class


@dataclass
class _Model:
    """A model_registry(...) call's settings (model.*)."""

    settings: dict[str, Any]


@dataclass
class _Trainer:
    """A Trainer.Config: its settings by 0.3 dotted key."""

    settings: dict[str, Any] = field(default_factory=dict)


class _Opaque:
    """A value Tessel does not read (decoder_vocab_size(...)): allowed where ignored."""

    def __repr__(self) -> str:
        return "<not read>"


def read_config_module(spec: str) -> tuple[dict[str, Any], str]:
    """The settings of the config function `spec` ("FILE.py:FUNCTION", or "FILE.py" with
    one function) and the name it is known by; JobConfigError (one line) otherwise."""
    path_text, _, function = spec.partition(".py:")
    path_text = path_text + ".py" if function else spec
    text = read_named_file(path_text, "a TorchTitan config module")
    try:
        tree = ast.parse(text, filename=path_text)
        reader = _Reader(path_text, tree)
        name = function or reader.only_function()
        value = reader.call_function(name, tree)
    except SyntaxError as error:
        raise JobConfigError(f"{path_text}:{error.lineno}: not Python ({error.msg}); give a "
                             "TorchTitan config module") from None
    except (RecursionError, MemoryError):  # Python's parser: nesting past its own limits
        raise JobConfigError(f"{path_text} nests expressions deeper than Python parses; "
                             "give a TorchTitan config module") from None
    if not isinstance(value, _Trainer):
        raise JobConfigError(f"{path_text}: {name}() returns no Trainer.Config; return "
                             "the config, as TorchTitan's config functions do")
    return value.settings, f"{path_text}:{name}"


class _Reader:
    """Evaluates the literals of one file's functions."""

    def __init__(self, path: str, tree: ast.Module) -> None:
        self.path = path
        self.functions = {node.name: node for node in tree.body
                          if isinstance(node, ast.FunctionDef)}
        self.imports: dict[str, str] = {}  # local name -> the dotted name imported
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                base = node.module or _package(path)
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    self.imports[alias.asname or alias.name.split(".")[0]] = alias.name
        self.active: list[str] = []

    def error(self, node: ast.AST, text: str) -> JobConfigError:
        return JobConfigError(f"{self.path}:{getattr(node, 'lineno', '?')}: {text}")

    def only_function(self) -> str:
        names = list(self.functions)
        if len(names) != 1:
            listed = ", ".join(names) or "none"
            raise JobConfigError(f"{self.path} defines {len(names)} functions ({listed}); "
                                 f"name one: --torchtitan {self.path}:FUNCTION")
        return names[0]

    def call_function(self, name: str, at: ast.AST) -> Any:
        node = self.functions.get(name)
        if node is None:
            near = difflib.get_close_matches(name, list(self.functions), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise self.error(at, f"no function {name}(){hint} in the file; name one of "
                             f"{', '.join(self.functions) or 'its functions'}")
        if name in self.active:
            raise self.error(node, f"{name}() calls itself; a config function returns a "
                             "config")
        arguments = node.args
        if arguments.args or arguments.posonlyargs or arguments.kwonlyargs or \
                arguments.vararg or arguments.kwarg:
            raise self.error(node, f"{name}() takes arguments; TorchTitan calls a config "
                             "function with none")
        self.active.append(name)
        try:
            return self._body(node)
        finally:
            self.active.pop()

    def _body(self, function: ast.FunctionDef) -> Any:
        names: dict[str, Any] = {}
        for statement in function.body:
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant) \
                    and isinstance(statement.value.value, str):
                continue  # the docstring
            if isinstance(statement, ast.Return) and statement.value is not None:
                return self.value(statement.value, names)
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                self._assign(statement.targets[0], self.value(statement.value, names), names)
                continue
            if isinstance(statement, ast.AnnAssign) and statement.value is not None:
                self._assign(statement.target, self.value(statement.value, names), names)
                continue
            raise self.error(statement, f"{_construct(statement)} is not a literal "
                             "assignment or return, which is all Tessel reads of a config "
                             "function (nothing in it is run); write the values themselves")
        raise self.error(function, f"{function.name}() returns nothing; return the "
                         "Trainer.Config")

    def _assign(self, target: ast.AST, value: Any, names: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            names[target.id] = value
            return
        path = _attribute_path(target)
        if path is None or path[0] not in names or not isinstance(names[path[0]], _Trainer):
            raise self.error(target, f"assignment to {ast.unparse(target)}: Tessel reads "
                             "assignments to names and to a Trainer.Config's fields "
                             "(config.parallelism.tensor_parallel_degree = 8)")
        _set(names[path[0]], path[1:], value, self, target)

    def value(self, node: ast.AST, names: dict[str, Any]) -> Any:
        if isinstance(node, ast.Constant) and not isinstance(node.value, bytes) \
                and node.value is not Ellipsis:
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.value(item, names) for item in node.elts]
        if isinstance(node, ast.Dict) and None not in node.keys:
            return {self.value(k, names): self.value(v, names)
                    for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            operand = self.value(node.operand, names)
            if isinstance(node.op, ast.Not):
                return not operand
            if _number(operand):
                return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
            left, right = self.value(node.left, names), self.value(node.right, names)
            if _number(left) and _number(right) and not (
                    isinstance(node.op, (ast.FloorDiv, ast.Div)) and right == 0):
                return self._bounded(node, _ARITHMETIC[type(node.op)](left, right))
        if isinstance(node, ast.BoolOp):
            values = [self.value(v, names) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(
                node.ops[0], (ast.In, ast.NotIn, ast.Eq, ast.NotEq)):
            left, right = self.value(node.left, names), self.value(node.comparators[0], names)
            result = {ast.In: lambda: left in right, ast.NotIn: lambda: left not in right,
                      ast.Eq: lambda: left == right, ast.NotEq: lambda: left != right}
            return result[type(node.ops[0])]()
        if isinstance(node, ast.Name):
            if node.id in names:
                return names[node.id]
            raise self.error(node, f"the name {node.id} is not a value the function assigns "
                             "(Tessel reads literals only; nothing is imported or run); write "
                             "the value itself")
        if isinstance(node, ast.Attribute):
            return self._read_attribute(node, names)
        if isinstance(node, ast.Call):
            return self._call(node, names)
        raise self.error(node, f"{_construct(node)} is not a literal Tessel can read (nothing "
                         "in a config is run); write the value itself")

    def _bounded(self, node: ast.AST, result: Any) -> Any:
        """`result`, refused where it is an integer beyond 64 bits: no setting is, and a
        name squared forty times over would not end (a number of 2^40 digits)."""
        if isinstance(result, int) and abs(result) >= 1 << 63:
            raise self.error(node, f"{_construct(node)} comes to a number beyond 64 bits; "
                                   "no TorchTitan setting is that large")
        return result

    def _read_attribute(self, node: ast.Attribute, names: dict[str, Any]) -> Any:
        path = _attribute_path(node)
        if path and path[0] in names and isinstance(names[path[0]], _Trainer):
            key = ".".join(path[1:])
            settings = names[path[0]].settings
            if key in settings:
                return settings[key]
            if key in NEXT_KEYS:
                return NEXT_KEYS[key][1].default
        if path and len(path) == 2 and isinstance(names.get(path[0]), _Section):
            section = names[path[0]]
            key = f"{section.name}.{path[1]}"
            if path[1] in section.fields:
                return section.fields[path[1]]
            if key in NEXT_KEYS:
                return NEXT_KEYS[key][1].default
        raise self.error(node, f"{ast.unparse(node)} is not a value Tessel can read (nothing "
                         "in a config is run); write the value itself")

    def _call(self, node: ast.Call, names: dict[str, Any]) -> Any:
        callee = ast.unparse(node.func)
        if any(isinstance(k.arg, type(None)) for k in node.keywords) or any(
                isinstance(a, ast.Starred) for a in node.args):
            raise self.error(node, f"{callee}(*...) or (**...): write each argument by name")
        args = [self.value(a, names) for a in node.args]
        kwargs = {k.arg: self.value(k.value, names) for k in node.keywords}
        if isinstance(node.func, ast.Name) and node.func.id in self.functions:
            if args or kwargs:
                raise self.error(node, f"{callee}() takes no arguments")
            value = self.call_function(node.func.id, node)
            return _Trainer(dict(value.settings)) if isinstance(value, _Trainer) else value
        if isinstance(node.func, ast.Name) and node.func.id in CONFIGS:
            if args or kwargs:
                raise self.error(node, f"{callee}() takes no arguments")
            return _Trainer(dict(CONFIGS[node.func.id].settings))
        return self._constructor(node, callee, args, kwargs)

    def _constructor(self, node: ast.Call, callee: str, args: list[Any],
                     kwargs: dict[str, Any]) -> Any:
        if callee == "Trainer.Config" and not args:
            trainer = _Trainer()
            for name, value in kwargs.items():
                _set(trainer, [name], value, self, node)
            return trainer
        if callee in SECTIONS and not args:
            return _Section(SECTIONS[callee], kwargs)
        if callee in FREE_CONSTRUCTORS and not args:
            return _Section(FREE_CONSTRUCTORS[callee], kwargs)
        policy = callee.removesuffix(".Config")
        if callee.endswith(".Config") and policy in CHECKPOINTING and not args:
            return _Section("activation_checkpoint", kwargs, CHECKPOINTING[policy])
        if callee in LOSSES:
            return _Section("loss", {}, callee.removesuffix(".Config"))
        if callee.endswith(".Config") and policy in CONVERTERS and not args:
            return (policy, kwargs)
        if callee == "default_adamw" and len(args) <= 1:
            lr = args[0] if args else kwargs.pop("lr", 8e-4)
            return _Section("optimizer", {"name": "AdamW", "lr": lr, **kwargs})
        if callee == "decoder_vocab_size":
            return _Opaque()
        if callee.split(".")[-1] == "model_registry" and len(args) == 1 and \
                isinstance(args[0], str):
            return self._model(node, callee, args[0], kwargs)
        raise self.error(node, f"a call to {callee}() is not one Tessel reads (it reads "
                         "Trainer.Config, the section configs, model_registry, "
                         "default_adamw and the checkpointing, loss and converter configs; "
                         "nothing is run); write the config with those")

    def _model(self, node: ast.Call, callee: str, flavor: str,
               kwargs: dict[str, Any]) -> _Model:
        origin = self.imports.get(callee.split(".")[0], "")
        parts = origin.split(".")
        module = parts[parts.index("models") + 1] if "models" in parts[:-1] else None
        if module is None:
            raise self.error(node, f"{callee}: import model_registry from a TorchTitan "
                             "model (from torchtitan.models.llama3 import model_registry) "
                             "so that Tessel knows which model it builds")
        unknown = [name for name in kwargs if name not in MODEL_ARGUMENTS]
        if unknown:
            raise self.error(node, f"model_registry has no argument {unknown[0]}; it takes "
                             f"{', '.join(MODEL_ARGUMENTS)}")
        return _Model({"model.module": module, "model.flavor": flavor,
                       **{f"model.{name}": value for name, value in kwargs.items()}})


def _set(trainer: _Trainer, path: list[str], value: Any, reader: _Reader,
         node: ast.AST) -> None:
    """A Trainer.Config field (`path`) set to `value`, checked against 0.3's names."""
    settings, name = trainer.settings, path[0]
    if len(path) == 1 and name == "model_spec":
        if not isinstance(value, _Model):
            raise reader.error(node, "model_spec must be model_registry(...) of a TorchTitan "
                               "model")
        for key in [k for k in settings if k.startswith("model.")]:
            del settings[key]
        settings |= value.settings
        return
    if len(path) == 1 and name in ("hf_assets_path", "dump_folder"):
        settings[name] = value
        return
    if len(path) == 1 and name == "activation_checkpoint" and value is None:
        _replace(settings, name, {}, "none")
        return
    if len(path) == 1 and isinstance(value, _Section):
        if value.name != name:
            raise reader.error(node, f"{name}= is given a {value.name} config; give its "
                               f"own ({name}=...)")
        for field_name in value.fields:
            _check_field(name, field_name, value.kind, reader, node)
        _replace(settings, name, value.fields, value.kind)
        return
    if len(path) == 2 and (path[0] in CHECKED_SECTIONS or path[0] in FREE_SECTIONS):
        _check_field(path[0], path[1], settings.get(path[0]), reader, node)
        settings[".".join(path)] = value
        return
    known = ", ".join(("model_spec", *CHECKED_SECTIONS, *FREE_SECTIONS))
    raise reader.error(node, f"Trainer.Config has no field {'.'.join(path)} Tessel reads "
                       f"({known})")


def _replace(settings: dict[str, Any], section: str, fields: dict[str, Any],
             kind: str | None) -> None:
    """A section given whole: its earlier fields go, its kind and fields come."""
    for key in [k for k in settings if k == section or k.startswith(section + ".")]:
        del settings[key]
    if kind is not None:
        settings[section] = kind
    settings |= {f"{section}.{name}": value for name, value in fields.items()}


def _check_field(section: str, name: str, kind: Any, reader: _Reader, node: ast.AST) -> None:
    """A field of a checked section must be one of 0.3's (by `next_keys`)."""
    if section in FREE_SECTIONS:
        return
    key = f"{section}.{name}"
    if key in NEXT_KEYS:
        return
    near = difflib.get_close_matches(key, list(NEXT_KEYS), n=1, cutoff=0.75)
    hint = f" (did you mean {near[0].split('.', 1)[1]}?)" if near else ""
    raise reader.error(node, f"{section} has no field {name} in TorchTitan 0.3{hint}; fix "
                       "or remove it")


def _attribute_path(node: ast.AST) -> list[str] | None:
    """config.parallelism.x -> ['config', 'parallelism', 'x'], or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _package(path: str) -> str:
    """The package of a relative import: torchtitan.models.<its folder>."""
    return f"torchtitan.models.{Path(path).resolve().parent.name}"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _construct(node: ast.AST) -> str:
    """How a refused construct is named: its kind and its start."""
    text = ast.unparse(node).splitlines()[0] if not isinstance(node, ast.FunctionDef) \
        else f"def {node.name}"
    text = text if len(text) <= 40 else text[:37] + "..."
    return f"{type(node).__name__.lower()} `{text}`"
