"""A Hugging Face config.json is data: loading and building it runs no code from its folder.

A hostile folder holds a config whose `auto_map` points every Auto class (and the config
class) at `evil.py` beside it, with `name_or_path` set to the folder so transformers would
find it. Importing `evil.py` writes a marker file, sets an environment variable and leaves
a module in `sys.modules`. Loading and building must give transformers' own Llama class,
with no marker, no variable, no module and no prompt on stdin ("Do you wish to run the
custom code?" is how transformers asks; `input` and stdin fail the test if touched).

`architectures` naming something other than a concrete transformers model class
(`AutoModel`, `AutoModelForMaskedLM`, a custom class name) is ignored in favour of the
class transformers registers for the model_type, not refused: Hub configs routinely name
a custom class there while their model_type is one transformers implements, and that
implementation is what the plan is for. Only when transformers has no class of its own
does loading fail, with one HFConfigError line.
"""

from __future__ import annotations

import builtins
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from planner.models.sources import ModelSpecError, load_model  # noqa: E402
from planner.models.huggingface import (  # noqa: E402
    HFConfigError,
    build_hf_model,
    load_hf_config,
)
from tests.models.hf_tiny import decoder_config_json  # noqa: E402

EVIL_ENV = "TESSEL_TEST_HF_REMOTE_CODE_RAN"

EVIL_PY = f"""
import os, pathlib, sys
pathlib.Path(__file__).with_name("MARKER").write_text("remote code ran")
os.environ[{EVIL_ENV!r}] = "1"
sys.modules["tessel_test_evil_marker"] = sys.modules[__name__]
from transformers import LlamaConfig, LlamaForCausalLM
class EvilConfig(LlamaConfig):
    pass
class EvilModel(LlamaForCausalLM):
    config_class = EvilConfig
"""

AUTO_CLASSES = ("AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoModelForMaskedLM")
AUTO_MAP = {name: f"evil.Evil{'Config' if name == 'AutoConfig' else 'Model'}"
            for name in AUTO_CLASSES}


def tiny_llama(**extra: Any) -> dict[str, Any]:
    return decoder_config_json(**{"model_type": "llama", **extra})


def hostile_dir(tmp_path: Path, **fields: Any) -> Path:
    folder = tmp_path / "hostile"
    folder.mkdir()
    (folder / "evil.py").write_text(EVIL_PY)
    config = tiny_llama(
        auto_map=AUTO_MAP,
        name_or_path=str(folder),
        _name_or_path=str(folder),
        trust_remote_code=True,
        **fields,
    )
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def no_code_may_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Fail on any prompt; keep a regression's dynamic-module copies out of ~/.cache."""
    asked: list[str] = []

    def refuse_input(prompt: str = "") -> str:
        asked.append(prompt)
        raise AssertionError(f"stdin was asked for: {prompt[:80]!r}")

    class ClosedStdin(io.StringIO):
        def read(self, *args: Any) -> str:
            raise AssertionError("stdin was read")

        readline = read

    monkeypatch.setattr(builtins, "input", refuse_input)
    monkeypatch.setattr(sys, "stdin", ClosedStdin())
    monkeypatch.delenv(EVIL_ENV, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    import transformers.dynamic_module_utils as dynamic

    monkeypatch.setattr(dynamic, "HF_MODULES_CACHE", str(tmp_path / "hf_modules"), raising=False)
    yield asked
    for name in [m for m in sys.modules if m.startswith("transformers_modules")]:
        sys.modules.pop(name)
    sys.modules.pop("tessel_test_evil_marker", None)


def assert_no_code_ran(folder: Path, asked: list[str]) -> None:
    assert not (folder / "MARKER").exists(), "evil.py was imported and run"
    assert EVIL_ENV not in os.environ
    assert "tessel_test_evil_marker" not in sys.modules
    assert not [m for m in sys.modules if m.startswith("transformers_modules")]
    assert not [m for m in sys.modules if m == "evil" or m.endswith(".evil")]
    assert asked == []


def build_class(config: Any) -> type:
    model, _ = build_hf_model(config)
    return type(model.hf_model)


def is_transformers_own(cls: type) -> bool:
    return cls.__module__.startswith("transformers.models.")


@pytest.mark.parametrize(
    "architectures",
    [["AutoModelForMaskedLM"], ["AutoModel"], ["EvilModel"], None],
    ids=["auto-masked-lm", "auto-model", "custom-name", "none"],
)
def test_auto_map_config_builds_transformers_own_class_and_imports_nothing(
    tmp_path: Path, no_code_may_run: list[str], architectures: list[str] | None
) -> None:
    extra = {} if architectures is None else {"architectures": architectures}
    folder = hostile_dir(tmp_path, **extra)
    config = load_hf_config(folder)
    assert not hasattr(config, "auto_map")
    assert config.name_or_path == ""
    cls = build_class(config)
    assert cls.__name__ == "LlamaForCausalLM" and is_transformers_own(cls)
    assert_no_code_ran(folder, no_code_may_run)


def test_hf_spec_of_a_hostile_folder_imports_nothing(
    tmp_path: Path, no_code_may_run: list[str]
) -> None:
    """The path `plan inspect hf:DIR` takes: load the spec, build it at its depth."""
    folder = hostile_dir(tmp_path, architectures=["AutoModelForMaskedLM"])
    loaded = load_model(f"hf:{folder}")
    built = loaded.build(None)
    assert is_transformers_own(type(built.model.hf_model))
    assert_no_code_ran(folder, no_code_may_run)


def test_auto_map_in_a_sub_config_is_dropped_too(
    tmp_path: Path, no_code_may_run: list[str]
) -> None:
    folder = hostile_dir(tmp_path, text_config={"model_type": "llama", "auto_map": AUTO_MAP})
    config = load_hf_config(folder)
    assert "auto_map" not in json.dumps(config.to_dict())
    assert_no_code_ran(folder, no_code_may_run)


def test_a_model_type_transformers_lacks_is_refused_without_importing(
    tmp_path: Path, no_code_may_run: list[str]
) -> None:
    folder = hostile_dir(tmp_path, model_type="evil")
    with pytest.raises(HFConfigError) as info:
        load_hf_config(folder)
    message = str(info.value)
    assert "\n" not in message and "'evil'" in message and str(folder) in message
    assert_no_code_ran(folder, no_code_may_run)


def test_a_mismatched_transformers_class_in_architectures_is_not_used(tmp_path: Path) -> None:
    """GPT-2's class for a Llama config is ignored: the class must match the config."""
    (tmp_path / "config.json").write_text(
        json.dumps(tiny_llama(architectures=["GPT2LMHeadModel"]))
    )
    assert build_class(load_hf_config(tmp_path)).__name__ == "LlamaForCausalLM"


@pytest.mark.parametrize(
    ("extra", "field", "reason"),
    [
        ({"hidden_size": "abc"}, "hidden_size", "expected int, got str"),
        ({"num_attention_heads": 3.5}, "num_attention_heads", "expected int, got float"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings", "expected bool"),
        ({"hidden_size": 65}, None, "not a multiple of the number of attention heads"),
    ],
    ids=["str-for-int", "float-for-int", "str-for-bool", "heads-do-not-divide"],
)
def test_an_invalid_field_is_one_hf_config_error_line(
    tmp_path: Path, extra: dict[str, Any], field: str | None, reason: str
) -> None:
    """transformers 5 validates with huggingface_hub's strict dataclasses, whose errors
    are neither ValueError nor TypeError; each still comes back as one HFConfigError line
    naming the file, the field and why."""
    file = tmp_path / "config.json"
    file.write_text(json.dumps(tiny_llama(**extra)))
    with pytest.raises(HFConfigError) as info:
        load_hf_config(file)
    message = str(info.value)
    assert "\n" not in message
    assert str(file) in message and reason in message
    if field is not None:
        assert f"field {field!r}" in message
    with pytest.raises(ModelSpecError) as spec_info:
        load_model(f"hf:{file}")
    assert "\n" not in str(spec_info.value) and reason in str(spec_info.value)


def test_a_non_string_model_type_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny_llama(model_type=["llama"])))
    with pytest.raises(HFConfigError, match="must be a string") as info:
        load_hf_config(tmp_path)
    assert "\n" not in str(info.value)
