"""planner.shell reads any script within its limits (`planner.shell.limits`): a value no
longer than Linux passes as one word, 64 MiB of text in all, 500,000 steps. A script that
asks for more stops at the line that reached the limit, in one line naming it, instead
of running the reader out of memory or time."""

from __future__ import annotations

import pytest

from planner.shell import ShellError, evaluate_script
from planner.shell.limits import MAX_WORD

TRAIN = "torchrun pretrain_gpt.py --num-layers $A\n"
WORD = ("line {line}: a value of {size:,} characters, longer than the 131,072 (128 KiB) Linux "
        "passes as one word to a command (MAX_ARG_STRLEN); Tessel stops there")
STEPS = ("line {line}: reading the script takes more than 500,000 steps (commands, values "
         "copied at each `if` Tessel cannot decide, characters matched against a pattern; a "
         "launch script takes a few hundred); Tessel stops there")


def refusal(script: str) -> str:
    with pytest.raises(ShellError) as caught:
        evaluate_script(script)
    return str(caught.value)


def test_a_value_of_128_kib_is_read_and_one_character_more_is_not() -> None:
    run = evaluate_script(f"A={'x' * MAX_WORD}\n" + TRAIN)
    assert len(run.commands[0].words[-1].text) == MAX_WORD
    assert refusal(f"A={'x' * MAX_WORD}\nA+=y\n" + TRAIN) == WORD.format(line=2,
                                                                          size=MAX_WORD + 1)


@pytest.mark.parametrize("doubling", ['A="$A$A"', "A=$A$A", 'A="${A}${A:-}"', "A+=$A"])
def test_a_value_doubled_forty_times_stops_where_it_passes_128_kib(doubling: str) -> None:
    # 2^17 characters on line 18 is a word bash could pass; line 19's 2^18 is not.
    assert refusal("A=x\n" + f"{doubling}\n" * 40 + TRAIN) == WORD.format(line=19,
                                                                          size=1 << 18)


def test_a_replacement_that_grows_a_value_stops_before_it_is_joined() -> None:
    script = f"A={'x' * 70_000}\nB=${{A//x/yy}}\n" + TRAIN
    assert refusal(script) == WORD.format(line=2, size=131_074)


def test_an_array_doubled_forty_times_stops_within_the_steps() -> None:
    assert refusal("A=(x)\n" + 'A=("${A[@]}" "${A[@]}")\n' * 40 + TRAIN) == STEPS.format(
        line=19)


def test_copies_of_a_long_value_stop_at_64_mib_in_all() -> None:
    script = f"A={'x' * MAX_WORD}\n" + 'B="$A"\n' * 400 + TRAIN
    assert refusal(script) == ("line 257: the script's values come to more than 64 MiB of "
                               "text in all (a launch script's come to a few KiB); Tessel "
                               "stops there")


def test_values_merged_after_undecidable_ifs_stop_within_the_steps() -> None:
    # 5,000 variables, each compared after every `if` on a file Tessel cannot test: the
    # 99th `if` (line 5,099) passes the limit.
    script = "".join(f"V{i}=1\n" for i in range(5_000)) \
        + "if [ -f x ]; then :; fi\n" * 200 + TRAIN
    assert refusal(script) == STEPS.format(line=5_099)


def test_a_pattern_scanned_from_every_position_stops_within_the_steps() -> None:
    # No b: bash (and Tessel) try the pattern at each of 100,000 positions to the end.
    script = f"A={'a' * 100_000}\nB=${{A//a*b/x}}\n" + TRAIN
    assert refusal(script) == STEPS.format(line=2)


def test_a_function_calling_itself_stops_at_its_depth() -> None:
    assert refusal("f() { f; f; }\nf\n" + TRAIN) == (
        "the function f calls itself more than 64 deep; Tessel stops there")
