"""planner.models.sources: every accepted MODEL form and every error a user can hit."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

from planner.models.sources import LoadedModel, ModelSpecError, load_model

FACTORIES = """
import torch
from torch import nn

def two():
    return nn.Linear(4, 2), (torch.randn(3, 4),)

def three():
    return nn.Linear(4, 2), (torch.randn(3, 4),), lambda out, x: out.sum()

def bare_tensor():
    return nn.Linear(4, 2), torch.randn(3, 4)

def not_a_tuple():
    return nn.Linear(4, 2)

def too_long():
    return nn.Linear(4, 2), (torch.randn(3, 4),), None, None

def bad_model():
    return "linear", (torch.randn(3, 4),)

def bad_inputs():
    return nn.Linear(4, 2), {"x": torch.randn(3, 4)}

def bad_loss():
    return nn.Linear(4, 2), (torch.randn(3, 4),), 42
"""


def write(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(source))
    return path


@pytest.fixture
def factories(tmp_path: Path) -> Path:
    return write(tmp_path, "factories.py", FACTORIES)


# ---- accepted forms -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_demo(name: str) -> None:
    loaded = load_model(f"demo:{name}")
    assert isinstance(loaded, LoadedModel)
    assert isinstance(loaded.model, nn.Module)
    assert isinstance(loaded.example_inputs, tuple)
    assert loaded.loss_fn is None
    assert loaded.name == name
    loaded.model(*loaded.example_inputs)


def test_file_two_tuple(factories: Path) -> None:
    loaded = load_model(f"{factories}:two")
    assert isinstance(loaded.model, nn.Linear)
    assert loaded.example_inputs[0].shape == (3, 4)
    assert loaded.loss_fn is None
    assert loaded.name == "two"


def test_file_three_tuple_loss_contract(factories: Path) -> None:
    loaded = load_model(f"{factories}:three")
    assert loaded.loss_fn is not None
    output = loaded.model(*loaded.example_inputs)
    loss = loaded.loss_fn(output, *loaded.example_inputs)
    assert loss.dim() == 0


def test_file_single_tensor_is_wrapped(factories: Path) -> None:
    loaded = load_model(f"{factories}:bare_tensor")
    assert isinstance(loaded.example_inputs, tuple)
    assert len(loaded.example_inputs) == 1


def test_relative_file_path(factories: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(factories.parent)
    assert isinstance(load_model("factories.py:two").model, nn.Linear)


def test_two_files_with_same_name_do_not_collide(tmp_path: Path) -> None:
    paths = []
    for width in (1, 2):
        directory = tmp_path / f"dir{width}"
        directory.mkdir()
        source = f"""
            import torch
            from torch import nn

            def f():
                return nn.Linear({width}, 1), (torch.zeros(1, {width}),)
        """
        paths.append(write(directory, "model.py", source))
    assert [load_model(f"{path}:f").model.in_features for path in paths] == [1, 2]


def test_module_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "tessel_spec_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    write(package, "zoo.py", FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tessel_spec_pkg", raising=False)
    loaded = load_model("tessel_spec_pkg.zoo:three")
    assert isinstance(loaded.model, nn.Linear)
    assert callable(loaded.loss_fn)


def test_deterministic_given_seed() -> None:
    torch.manual_seed(0)
    first = load_model("demo:mlp")
    torch.manual_seed(0)
    second = load_model("demo:mlp")
    assert torch.equal(first.example_inputs[0], second.example_inputs[0])
    assert torch.equal(first.model.fc1.weight, second.model.fc1.weight)


# ---- errors ---------------------------------------------------------------------------


def load_error(spec: str, match: str) -> str:
    """The message of the ModelSpecError loading `spec` raises (it must match `match`)."""
    with pytest.raises(ModelSpecError, match=match) as info:
        load_model(spec)
    return str(info.value)


def test_unknown_demo_lists_known_demos() -> None:
    message = load_error("demo:bert", "Unknown demo 'bert'")
    assert "gpt" in message and "mlp" in message


def test_unknown_name_without_colon_shows_forms() -> None:
    message = load_error("nocolon", "unknown model 'nocolon'")
    assert "demo:NAME" in message
    assert "path/to/file.py:function" in message
    assert "package.module:function" in message


@pytest.mark.parametrize("spec", ["demo:", ":f", "model.py:"])
def test_empty_side_of_colon(spec: str) -> None:
    assert "demo:NAME" in load_error(spec, "missing a part")


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.py"
    message = load_error(f"{missing}:f", "does not exist")
    assert "nope.py" in message
    assert "check the path" in message


def test_file_that_does_not_import(tmp_path: Path) -> None:
    broken = write(tmp_path, "broken.py", "import torch\ndef f(:\n    pass\n")
    message = load_error(f"{broken}:f", "failed to import")
    assert "SyntaxError" in message
    assert "broken.py" in message


def test_file_raising_at_import(tmp_path: Path) -> None:
    broken = write(tmp_path, "raises.py", "raise RuntimeError('no GPU here')\n")
    load_error(f"{broken}:f", "no GPU here")


def test_module_that_does_not_import() -> None:
    message = load_error("tessel_no_such_package.models:build", "could not be imported")
    assert "tessel_no_such_package.models" in message
    assert "PYTHONPATH" in message


def test_missing_function_names_defined_functions(factories: Path) -> None:
    message = load_error(f"{factories}:build", "defines no function 'build'")
    assert "two" in message and "three" in message
    # Names imported into the file are not the user's functions.
    assert "randn" not in message


def test_missing_function_in_file_with_no_functions(tmp_path: Path) -> None:
    empty = write(tmp_path, "empty.py", "X = 1\n")
    load_error(f"{empty}:f", "functions it defines: none")


@pytest.mark.parametrize(
    ("function", "words"),
    [
        ("not_a_tuple", "returned Linear"),
        ("too_long", "tuple of length 4"),
        ("bad_model", "model of type str"),
        ("bad_inputs", "example_inputs of type dict"),
        ("bad_loss", "loss_fn of type int"),
    ],
)
def test_bad_return_value(factories: Path, function: str, words: str) -> None:
    assert "(model, example_inputs)" in load_error(f"{factories}:{function}", words)


def test_error_is_a_value_error() -> None:
    assert issubclass(ModelSpecError, ValueError)
