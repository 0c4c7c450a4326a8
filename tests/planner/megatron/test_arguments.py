"""planner.megatron.arguments: the flags through Megatron-LM's own option list.

Every flag Megatron-LM accepts, with its type, choices and default; every mistake one
`LaunchLineError` naming the flag as typed.
"""

from __future__ import annotations

import json

import pytest

from planner.megatron.arguments import (
    ARGUMENTS_ENV,
    arguments_file,
    megatron_parser,
    parse_megatron_flags,
)
from planner.megatron.errors import LaunchLineError


def test_the_parser_is_megatron_lms_own_option_list() -> None:
    options = json.loads(arguments_file().read_text())["options"]
    parser = megatron_parser()
    flags = {flag for option in options if option["action"] != "_HelpAction"
             for flag in option["flags"]}
    assert flags <= set(parser.dest_of)


def test_absent_flags_take_megatron_lms_defaults_and_enums_take_bare_values() -> None:
    args = parse_megatron_flags(["--attention-backend", "fused", "--swiglu"])
    assert args.values.attention_backend == "fused"
    assert parse_megatron_flags(["--attention-backend", "AttnBackend.local"]).values \
        .attention_backend == "local"
    assert args.values.tensor_model_parallel_size == 1
    assert args.values.make_vocab_size_divisible_by == 128
    assert args.values.add_bias_linear is True  # --disable-bias-linear is store_false
    assert args.typed == {"attention_backend": "--attention-backend", "swiglu": "--swiglu"}


def test_a_flag_given_no_value_is_read_as_absent_and_named() -> None:
    # A script's `--save $CHECKPOINT_PATH --num-layers` with $1 not given, as bash expands it.
    args = parse_megatron_flags(["--save", "--num-layers", "4", "--load"])
    assert args.valueless == {"save": "--save", "load": "--load"}
    assert args.values.num_layers == 4 and not args.given("save")


@pytest.mark.parametrize("words, fragments", [
    (["--tensor-parallel-size", "2"],
     ["unknown Megatron-LM option --tensor-parallel-size",
      "did you mean --tensor-model-parallel-size?"]),
    (["--num-layers", "four"], ["--num-layers 'four' is not a whole number"]),
    (["--num-layers=4.5"], ["--num-layers '4.5' is not a whole number"]),
    (["--attention-backend", "fast"], ["--attention-backend 'fast' is not one of", "flash"]),
    (["--bf16=yes"], ["--bf16 takes no value"]),
    (["--bf16", "8"], ["unexpected word '8'"]),
])
def test_a_bad_flag_is_one_error_naming_it(words: list[str], fragments: list[str]) -> None:
    with pytest.raises(LaunchLineError) as caught:
        parse_megatron_flags(words)
    for fragment in fragments:
        assert fragment in str(caught.value)


def test_a_missing_option_list_names_the_file_and_the_variable(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(ARGUMENTS_ENV, str(tmp_path / "nowhere.json"))
    with pytest.raises(LaunchLineError) as caught:
        parse_megatron_flags(["--num-layers", "4"])
    assert "nowhere.json" in str(caught.value) and ARGUMENTS_ENV in str(caught.value)
