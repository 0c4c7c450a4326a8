"""planner.shell expands a launch script's training command word for word as bash does.

Each construct of the corpus is a small launch script; bash itself runs a harmless copy
whose training command is replaced by `printf '%s\\n'` (in an empty folder, with an empty
environment but PATH and what the case gives), and the words it prints must be the words
`evaluate_script` reads, in order.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from planner.shell import evaluate_script

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash is not installed")

# name -> (script, environment, positional parameters). Each script's training command
# starts a line with `torchrun`.
CORPUS: dict[str, tuple[str, dict[str, str], list[str]]] = {
    "variables-and-defaults": ("""
NNODES=${SLURM_NNODES:-"1"}
GPUS=${GPUS_PER_NODE:-8}
MASTER=${MASTER_ADDR:-localhost}
torchrun --nnodes $NNODES --nproc-per-node ${GPUS} pretrain_gpt.py --num-layers 4
""", {"SLURM_NNODES": "4"}, []),
    "assigning-default": ("""
: ${TP:=2}
torchrun pretrain_gpt.py --tensor-model-parallel-size $TP --x ${PP:=4} --y $PP
""", {}, []),
    "unset-versus-empty": ("""
EMPTY=
torchrun pretrain_gpt.py --a "${EMPTY-unset}" --b "${EMPTY:-null}" --c ${NONE-none} \\
    ${EMPTY:+alt} --d
""", {}, []),
    "alternative-value": ("""
FP8=1
torchrun pretrain_gpt.py ${FP8:+--fp8-format hybrid} ${BF16:+--bf16} --end
""", {}, []),
    "arithmetic": ("""
GPUS_PER_NODE=8
NUM_NODES=2
WORLD_SIZE=$(($GPUS_PER_NODE*$NUM_NODES))
DP=$(( WORLD_SIZE / (2 * 4) ))
NEG=$(( -7 / 2 )) MOD=$(( -7 % 3 )) POW=$(( 2 ** 10 )) TERN=$(( DP > 1 ? DP : 1 ))
HEX=$(( 0x10 + 010 ))
torchrun pretrain_gpt.py --w $WORLD_SIZE --dp $DP --n $NEG $MOD $POW $TERN $HEX
""", {}, []),
    "arrays-appended-quoted": ("""
DDP_ARGS=(
    --use-distributed-optimizer
    --overlap-grad-reduce
)
TRAINING_ARGS=(--micro-batch-size 1)
TRAINING_ARGS+=("${DDP_ARGS[@]}")
TRAINING_ARGS+=(--bf16)
torchrun pretrain_gpt.py "${TRAINING_ARGS[@]}"
""", {}, []),
    "unquoted-array-items-split": ("""
DTYPE_ARGS=()
DTYPE_ARGS+=(
    "--fp8-format hybrid"
    "--fp8-amax-history-len 1024"
    "--split '99,1,0'"
)
torchrun pretrain_gpt.py ${DTYPE_ARGS[@]}
""", {}, []),
    "joined-array": ("""
A=(one two "three four")
torchrun pretrain_gpt.py --joined "${A[*]}" --count ${#A[@]} --second ${A[1]} \\
    --last "${A[-1]}" --plain $A
""", {}, []),
    "export-declare-local": ("""
export CUDA_DEVICE_MAX_CONNECTIONS=1
declare -a EXTRA=(--x 1)
readonly LAYERS=32
width() { local H=$1; WIDTH=$((H * 128)); }
width 32
H=outside
torchrun pretrain_gpt.py --num-layers $LAYERS --hidden-size $WIDTH "${EXTRA[@]}" --h $H
""", {}, []),
    "continuations-and-comments": ("""
MODEL_ARGS=(
    --num-layers 24   # depth
    # --hidden-size 9999 (commented out)
    --hidden-size 2048
)
torchrun \\
    pretrain_gpt.py \\
    ${MODEL_ARGS[@]} \\
    --seq-length 2048 # the sequence
""", {}, []),
    "if-elif-else-patterns": ("""
DTYPE="fp8-hybrid"
if [[ "$DTYPE" == "bf16" ]]; then
    PREC=(--bf16)
elif [[ $DTYPE == fp8* && -n "$DTYPE" ]]; then
    PREC=(--bf16 --fp8-format ${DTYPE#fp8-})
else
    PREC=(--fp16)
fi
torchrun pretrain_gpt.py ${PREC[@]}
""", {}, []),
    "single-bracket-tests": ("""
ARGS=()
if [ -z $UNSET_VAR ]; then ARGS+=(--a); fi
if [ -n "$UNSET_VAR" ]; then ARGS+=(--b); fi
if [ "$MODE" = "mock" -o "$MODE" = "real" ]; then ARGS+=(--c); fi
if [ ! "$MODE" != "mock" ]; then ARGS+=(--d); fi
if test -n "x"; then ARGS+=(--e); fi
torchrun pretrain_gpt.py "${ARGS[@]}"
""", {"MODE": "mock"}, []),
    "numeric-tests": ("""
NODES=4
ARGS=()
if [ $NODES -gt 1 ]; then ARGS+=(--multi); fi
if [[ $NODES -le 2 ]]; then ARGS+=(--small); else ARGS+=(--large); fi
if (( NODES * 8 >= 32 )); then ARGS+=(--32-or-more); fi
if [[ NODES+1 -eq 5 ]]; then ARGS+=(--arith-operand); fi
torchrun pretrain_gpt.py "${ARGS[@]}"
""", {}, []),
    "and-or-lists": ("""
[ -z "$TP" ] && TP=8
[ -n "$PP" ] || PP=2
true && A=yes || A=no
false && B=yes || B=no
torchrun pretrain_gpt.py --tp $TP --pp $PP --a $A --b $B
""", {}, []),
    "case-patterns": ("""
case $MODEL in
    8b|8B) LAYERS=32; HIDDEN=4096 ;;
    70b) LAYERS=80; HIDDEN=8192 ;;
    *) LAYERS=2; HIDDEN=256 ;;
esac
case "$SIZE" in
    small) S=1 ;;
esac
torchrun pretrain_gpt.py --num-layers $LAYERS --hidden-size $HIDDEN --s "${S:-none}"
""", {"MODEL": "70b"}, []),
    "positional-parameters": ("""
CHECKPOINT_PATH=${1:-"checkpoints/default"}
DATA=$2
shift
torchrun pretrain_gpt.py --save "$CHECKPOINT_PATH" --data-path $DATA --count $# --rest "$@"
""", {}, ["ckpt", "/data/a", "extra one", "two"]),
    "functions-and-return": ("""
add_flag() {
    FLAGS+=("$1" "$2")
    return 0
    FLAGS+=(--never)
}
FLAGS=()
add_flag --num-layers 12
add_flag --hidden-size 768
torchrun pretrain_gpt.py "${FLAGS[@]}"
""", {}, []),
    "pattern-operators": ("""
PATH_=/data/corpus/text_document.bin
NAME=llama3_8b_fp8
torchrun pretrain_gpt.py --a ${PATH_#*/} --b ${PATH_##*/} --c ${PATH_%.*} --d ${PATH_%%/*}x \\
    --e ${NAME//_/-} --f ${NAME/8b/70b} --g ${NAME^^} --h ${NAME:0:6} --i ${NAME: -3} --j ${#NAME}
""", {}, []),
    "quoting": ("""
V=value
torchrun pretrain_gpt.py 'single $V' "double $V" "\\$V" $'tab\\there' "nested ${U:-"a b"}" \\
    ${U:-"c d"} ${U:-e f} "it's" escaped\\ space ""
""", {}, []),
    "skipped-commands-and-heredoc": ("""
mkdir -p ckpt
echo "torchrun pretrain_gpt.py --not-this-one" > /dev/null
cat > /dev/null <<EOF
torchrun pretrain_gpt.py --nor-this
\\$(never)
EOF
printf '%s' "" > /dev/null
torchrun pretrain_gpt.py --this-one
""", {}, []),
    "environment-prefix-and-pipe": ("""
LAYERS=2
NCCL_DEBUG=INFO torchrun --nproc_per_node=8 pretrain_gpt.py --num-layers $LAYERS 2>&1 | tee log.txt
""", {}, []),
    "exit-guard-on-a-file": ("""
if [ ! -f "pretrain_gpt.py" ]; then
    echo "run from Megatron-LM's root"
    exit 1
fi
torchrun pretrain_gpt.py --guarded
""", {}, []),
    "indirection-and-brace-groups": ("""
TP_SIZE=4
WHICH=TP_SIZE
{ A=1; B=2; }
( C=3 )
torchrun pretrain_gpt.py --tp ${!WHICH} --a $A --b $B --c "${C:-unset}"
""", {}, []),
    "arrays-by-index": ("""
SIZES=(1 2 4)
SIZES[3]=8
SIZES+=(16)
I=2
torchrun pretrain_gpt.py --pick ${SIZES[I]} --pick ${SIZES[$I+1]} --all ${SIZES[@]} --n ${#SIZES[*]}
""", {}, []),
    "let-and-increments": ("""
N=1
let N=N*8
(( N++ ))
M=$(( N-- ))
torchrun pretrain_gpt.py --n $N --m $M
""", {}, []),
    "unquoted-variable-splits": ("""
OLD_STYLE="--seq-length 1024   --micro-batch-size 2"
torchrun pretrain_gpt.py $OLD_STYLE "$OLD_STYLE"x
""", {}, []),
    # Bash's arithmetic is 64-bit and wraps around: 2 ** 2 ** 40 is 0, not 2^40 bits.
    "arithmetic-wraps-at-64-bits": ("""
BIG=$(( 2 ** 63 )) TOWER=$(( 2 ** 2 ** 40 )) SHIFT=$(( 1 << 65 )) NEG=$(( -5 >> 70 ))
WIDE=$(( 99999999999999999999 )) HEX=$(( 0x1ffffffffffffffff )) B64=$(( 64#zZ@_ ))
MIN=$(( (-9223372036854775807 - 1) / -1 )) POW=$(( 3 ** 100 )) LOW=$(( 36#Zz ))
torchrun pretrain_gpt.py $BIG $TOWER $SHIFT $NEG $WIDE $HEX $B64 $MIN $POW $LOW
""", {}, []),
    # Leftmost-longest matches, the null pattern, an empty value; and patterns of several
    # stars on 1,000 characters (a regular expression of them took 26 s).
    "patterns-matched-as-bash-matches-them": ("""
A=abc E= B=aXbXc C=abab
LONG=""" + "a" * 1000 + """
case $LONG in *a*a*a*b) K=matched ;; *) K=unmatched ;; esac
[[ $LONG == *a*a*b ]] || T=unmatched
torchrun pretrain_gpt.py "${A//*/x}" "${A/b*/x}" "${A/#/x}" "${A/%/x}" "${A//""/x}" \\
    "[${E//*/x}]" "${B//[a-c]/_}" "${B/%X*/}" "${B/#*X/}" "${C//a*b/x}" "${B//\\?/q}" \\
    "${LONG//*a*a*b/x}" "${LONG%%*b}" "${LONG#a*b}" $K $T
""", {}, []),
}


def bash_words(script: str, environment: dict[str, str], arguments: list[str],
               folder: Path) -> list[str]:
    """What bash passes the training command: a copy with `torchrun` replaced by
    `printf '%s\\n' torchrun`, run in `folder`."""
    harmless = re.sub(r"^((?:[A-Z_]+=\S+ )*)torchrun", r"\1printf '%s\\n' torchrun", script,
                      flags=re.MULTILINE)
    path = folder / "launch.sh"
    path.write_text(harmless)
    (folder / "pretrain_gpt.py").touch()
    result = subprocess.run(
        [BASH, str(path), *arguments], cwd=folder, capture_output=True, text=True,
        env={"PATH": "/usr/bin:/bin", **environment}, timeout=30, check=True)
    return result.stdout.splitlines()


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_training_command_has_the_words_bash_gives_it(name: str, tmp_path: Path) -> None:
    script, environment, arguments = CORPUS[name]
    expected = bash_words(script, environment, arguments, tmp_path)
    run = evaluate_script(script, environment, arguments)
    commands = [c for c in run.commands if c.kind == "script"]
    assert len(commands) == 1 and commands[0].unknown is None
    words = [word.text for word in commands[0].words]
    if name == "environment-prefix-and-pipe":
        assert commands[0].env == ("NCCL_DEBUG=INFO",)
    assert words == expected
    assert all(word.unknown is None for word in commands[0].words)


def test_the_corpus_covers_twenty_constructs() -> None:
    assert len(CORPUS) >= 20


SCRIPTS = Path(__file__).resolve().parents[1] / "megatron" / "launch_scripts"


@pytest.mark.parametrize("script", sorted(p.name for p in SCRIPTS.glob("*.sh")))
def test_megatron_lms_example_scripts_read_as_bash_runs_them(script: str,
                                                             tmp_path: Path) -> None:
    text = (SCRIPTS / script).read_text()
    expected = bash_words(text, {"PWD": str(tmp_path)}, [], tmp_path)
    run = evaluate_script(text, {"PWD": str(tmp_path)})
    [command] = [c for c in run.commands if c.kind == "script"]
    assert [word.text for word in command.words] == expected
