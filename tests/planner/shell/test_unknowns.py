"""What planner.shell cannot know stays unknown, named with its construct and line, and
nothing in a script is ever run.

A command substitution, backquotes, a loop, `source`, `eval`, an `if` on a file test: the
values they touch are marked unknown (and refused where they reach the training command,
`planner.megatron.launch_text`), never guessed; a script full of `$(touch PWNED)` in every
position leaves no file behind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.shell import ShellError, evaluate_script


def training(script: str, **kwargs):  # type: ignore[no-untyped-def]
    [command] = [c for c in evaluate_script(script, **kwargs).commands if c.kind == "script"]
    return command


def word(command, text: str):  # type: ignore[no-untyped-def]
    return next(w for w in command.words if w.text == text or text in w.text)


# Every position a command could hide in: assignment values, array items, defaults,
# arithmetic, conditions, case words, function bodies, here-documents, command names,
# prefixes, eval and source, loops, subshells and pipelines.
HOSTILE = r"""
A=$(touch PWNED_1)
B=`touch PWNED_2`
C=(--x "$(touch PWNED_3)" `touch PWNED_4`)
D=${UNSET:-$(touch PWNED_5)}
E=$(( $(touch PWNED_6) + 1 ))
if [ -n "$(touch PWNED_7)" ]; then F=1; fi
if touch PWNED_8; then G=1; fi
case $(touch PWNED_9) in *) H=1 ;; esac
f() { touch PWNED_10; }
f
cat <<EOF
$(touch PWNED_11)
EOF
PWNED_12=`touch PWNED_12` touch PWNED_13
eval "touch PWNED_14"
source ./evil.sh
. ./evil.sh
for i in 1 2; do touch PWNED_15; done
while touch PWNED_16; do break; done
( touch PWNED_17 )
touch PWNED_18 | touch PWNED_19
$(echo touch) PWNED_20
X="$(touch PWNED_21)" torchrun pretrain_gpt.py --save "$(touch PWNED_22)" `touch PWNED_23`
"""


def test_no_command_of_a_script_is_ever_run(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "evil.sh").write_text("touch PWNED_SOURCED\n")
    run = evaluate_script(HOSTILE)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evil.sh"]
    command = next(c for c in run.commands if c.kind == "script" and c.unknown is None)
    assert word(command, "PWNED_22").unknown.startswith("the command substitution")
    assert word(command, "PWNED_23").unknown


def test_a_command_substitution_is_unknown_where_it_lands() -> None:
    command = training("NODES=$(scontrol show hostnames | wc -l)\n"
                       "torchrun --nnodes $NODES pretrain_gpt.py --num-layers 2\n")
    nodes = command.words[2]
    assert nodes.unknown == ("the command substitution $(scontrol show hostnames | wc -l) "
                             "on line 1, which Tessel does not run")
    assert command.words[-1].unknown is None


def test_a_value_set_in_a_loop_is_unknown() -> None:
    command = training("ARGS=()\nfor L in 1 2; do ARGS+=(--layer $L); done\n"
                       "torchrun pretrain_gpt.py ${ARGS[@]} --bf16\n")
    assert command.words[2].unknown == ("$ARGS, set in the for loop on line 2, which Tessel "
                                        "does not run")
    assert command.words[-1].unknown is None


def test_a_training_command_inside_a_loop_is_unknown() -> None:
    command = training("for N in 1 2; do\n  torchrun pretrain_gpt.py --num-layers $N\ndone\n")
    assert command.unknown == "it runs inside the for loop on line 1, which Tessel does not run"


def test_source_and_eval_make_what_they_could_set_unknown() -> None:
    command = training("TP=2\nsource ./cluster.env\nPP=4\n"
                       "torchrun pretrain_gpt.py --tp $TP --pp $PP --cp $CP\n")
    texts = {w.text: w for w in command.words}
    assert texts["$TP"].unknown == ("$TP (`source ./cluster.env` on line 2, a file Tessel "
                                    "does not read may set it)")
    assert texts["4"].unknown is None  # set after the file is read
    assert texts["$CP"].unknown.startswith("$CP (`source ./cluster.env` on line 2")
    command = training('eval "TP=8"\ntorchrun pretrain_gpt.py --tp ${TP:-1}\n')
    assert command.words[-1].unknown.startswith("$TP (`eval` on line 1")


def test_an_if_tessel_cannot_evaluate_makes_what_its_branches_disagree_on_unknown() -> None:
    command = training("""
if [ -f /etc/cluster_a ]; then
    TP=8; PP=2
else
    TP=4; PP=2
fi
torchrun pretrain_gpt.py --tp $TP --pp $PP
""")
    assert command.words[3].unknown.startswith("$TP, set differently by the condition of the "
                                               "`if` on line 2")
    assert command.words[5].text == "2" and command.words[5].unknown is None


def test_a_branch_that_exits_is_the_one_not_taken() -> None:
    command = training("""
if ! command -v nvidia-smi; then
    echo "no GPUs"; exit 1
fi
TP=2
torchrun pretrain_gpt.py --tp $TP
""")
    assert command.unknown is None and command.words[-1].text == "2"


def test_a_training_command_on_one_side_of_an_unknown_if_is_unknown() -> None:
    run = evaluate_script("""
if [ -d /scratch ]; then
    torchrun pretrain_gpt.py --save /scratch/ckpt
fi
""")
    [command] = run.commands
    assert command.unknown.startswith("it runs only on one side of the condition of the `if` "
                                      "on line 2")


def test_an_environment_variable_is_read_and_the_machines_kept_as_written() -> None:
    command = training("NNODES=${SLURM_NNODES:-1}\n"
                       "torchrun --nnodes $NNODES pretrain_gpt.py --data-cache-path $PWD/c\n",
                       environment={"SLURM_NNODES": "16"})
    assert command.words[2].text == "16" and command.words[2].via == "SLURM_NNODES"
    assert command.words[-1].text == "$PWD/c" and command.words[-1].machine


def test_each_word_knows_its_line_and_variable() -> None:
    command = training("LAYERS=32\nARGS=(\n  --num-layers $LAYERS\n  --bf16\n)\n"
                       "torchrun pretrain_gpt.py ${ARGS[@]} --seq-length 8\n")
    lines = {w.text: (w.line, w.via) for w in command.words}
    assert lines["--num-layers"] == (3, None)
    assert lines["32"] == (1, "LAYERS")
    assert lines["--bf16"] == (4, None)
    assert lines["--seq-length"] == (6, None)


@pytest.mark.parametrize("script, message", [
    ('A="open\n', 'line 1: the quote " opened here is not closed; close it'),
    ("if true; then A=1\n", "line 1: 'if' expects 'fi', found 'the end of the text'"),
    ("A=(--x\n", "line 1: the array started here is not closed by )"),
    ("echo ${A:?give A}\n", "line 1: ${A:?give A} stops the script when A is unset or empty; "
                            "give it with --env A=VALUE"),
    ("f() { f; }\nf\n", "the function f calls itself more than 64 deep; Tessel stops there"),
    ("diff <(ls) <(ls)\n", "line 1: process substitution <( ... ) is not read"),
])
def test_text_bash_would_not_read_either_is_one_line_naming_it(script: str,
                                                                message: str) -> None:
    with pytest.raises(ShellError) as error:
        evaluate_script(script)
    assert str(error.value).startswith(message)
