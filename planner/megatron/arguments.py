"""Megatron-LM's argument parser, rebuilt from its own option list.

`parse_megatron_flags` reads a launch line's flags through an argparse parser built from
`../shared/reference/megatron_lm_arguments.json` (located by `TESSEL_MEGATRON_ARGUMENTS`):
every flag Megatron-LM accepts is accepted, with its type, choices and default, and every
mistake (an unknown flag, a stray word, a bad value) is one `LaunchLineError` naming the
flag as typed. `MegatronArgs` holds the result: each option's value or default, and how
the line spelt the flags it gives.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import functools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Sequence

from planner.megatron.errors import LaunchLineError
from planner.models.flags import VALUE_FLAGS

ARGUMENTS_ENV = "TESSEL_MEGATRON_ARGUMENTS"
# Where the reference sits next to a checkout: <repo>/../shared/reference/.
_DEFAULT_ARGUMENTS = (
    Path(__file__).resolve().parents[2].parent / "shared" / "reference"
    / "megatron_lm_arguments.json"
)
# Largest global batch and micro-batch read: 16M sequences, as `plan` bounds them.
MAX_BATCH = 1 << 24
# dest -> the largest value read: the shape flags as `plan` bounds them, and batches.
_LARGEST = {
    **{flag.removeprefix("--").replace("-", "_"): largest
       for flag, (_, largest) in VALUE_FLAGS.items()},
    "padded_vocab_size": VALUE_FLAGS["--vocab-size"][1],
    "moe_ffn_hidden_size": VALUE_FLAGS["--ffn-hidden-size"][1],
    "moe_shared_expert_intermediate_size": VALUE_FLAGS["--ffn-hidden-size"][1],
    **dict.fromkeys(("kv_channels", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
                     "qk_pos_emb_head_dim", "v_head_dim"), VALUE_FLAGS["--hidden-size"][1]),
    "micro_batch_size": MAX_BATCH, "global_batch_size": MAX_BATCH,
}


def arguments_file() -> Path:
    """The reference option list: $TESSEL_MEGATRON_ARGUMENTS, else next to the checkout."""
    path = Path(os.environ.get(ARGUMENTS_ENV) or _DEFAULT_ARGUMENTS).expanduser()
    if not path.is_file():
        raise LaunchLineError(
            f"Megatron-LM's option list {str(path)!r} is missing; set {ARGUMENTS_ENV} to "
            "the path of megatron_lm_arguments.json (shared/reference/ next to the checkout)"
        )
    return path


class MegatronParser(argparse.ArgumentParser):
    """Megatron-LM's flags as argparse reads them, answering every mistake with one
    `LaunchLineError` that names the flag as typed."""

    def __init__(self, options: list[dict[str, Any]]) -> None:
        super().__init__(prog="pretrain_gpt.py", add_help=False, allow_abbrev=False,
                         exit_on_error=False)
        self.dest_of: dict[str, str] = {}
        """Every flag (both spellings of a switch) -> its dest."""
        self.defaults_of: dict[str, Any] = {}
        self.flag_of: dict[str, str] = {}
        """dest -> its first flag, to name an option the line does not give."""
        for option in options:
            self._add(option)

    def _add(self, option: dict[str, Any]) -> None:
        flags, dest, action = option["flags"], option["dest"], option["action"]
        if action == "_HelpAction":
            return
        default = _default(option)
        self.defaults_of[dest] = default
        self.flag_of.setdefault(dest, flags[0])
        if action == "BooleanOptionalAction":
            positive = [f for f in flags if not f.startswith("--no-")]
            self.add_argument(*positive, dest=dest, default=default,
                              action=argparse.BooleanOptionalAction)
        elif action in ("_StoreTrueAction", "_StoreFalseAction"):
            kind = "store_true" if action == "_StoreTrueAction" else "store_false"
            self.add_argument(*flags, dest=dest, default=default, action=kind)
        else:
            convert = _CONVERTERS.get(option["type"], _text)
            choices = option["choices"]
            if choices is not None:
                choices = [_choice(c, convert) for c in choices]
            nargs = option["nargs"]
            self.add_argument(*flags, dest=dest, default=default, type=convert,
                              choices=choices, nargs=None if nargs == 0 else nargs,
                              metavar="VALUE")
        for flag in flags:  # a switch's --no- spelling is listed too
            self.dest_of[flag] = dest

    def valueless(self, words: Sequence[str]) -> list[int]:
        """Indices of the flags in `words` that take a value but are given none: the next
        word is another flag, or there is none (a script's `--save $CHECKPOINT_PATH` with
        $1 not given, as bash expands it)."""
        found = []
        for index, word in enumerate(words):
            action = self._option_string_actions.get(word)
            if action is None or action.nargs not in (None, "+") and not (
                    isinstance(action.nargs, int) and action.nargs > 0):
                continue
            following = words[index + 1] if index + 1 < len(words) else None
            if following is None or following in self._option_string_actions:
                found.append(index)
        return found

    def parse_flags(self, words: Sequence[str]) -> argparse.Namespace:
        """The namespace of `words`; LaunchLineError for an unknown flag, a stray word or
        a bad value."""
        self._words = list(words)
        try:
            namespace, extra = self.parse_known_args(self._words)
        except argparse.ArgumentError as error:
            self.error(str(error))
        if extra:
            self._unknown(extra[0])
        return namespace

    def _unknown(self, word: str) -> NoReturn:
        if word.startswith("$"):
            raise LaunchLineError(
                f"the launch line uses {word}, a shell variable its text does not set; set "
                "it in the launch script or write its flags out")
        one_value = None if word.startswith("-") else self._after_one_value(word)
        if one_value is not None:
            flag, value = one_value
            raise LaunchLineError(
                f"{flag} takes one value and is given {value!r} then {word!r}, which "
                "Megatron-LM refuses too; if the script meant one value, quote it where bash "
                "splits it at blanks (an unquoted ${ARRAY[@]} or $VARIABLE)", word=flag)
        if not word.startswith("-"):
            raise LaunchLineError(
                f"unexpected word {word!r} in the Megatron-LM flags: a value with no flag "
                "before it, or a flag that takes no value; remove it or add its flag"
            )
        flag = word.split("=", 1)[0]
        close = difflib.get_close_matches(flag, list(self.dest_of), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else (
            "; see Megatron-LM's megatron/training/arguments.py for its flags")
        raise LaunchLineError(f"unknown Megatron-LM option {flag}{hint}", word=word)

    def _after_one_value(self, word: str) -> tuple[str, str] | None:
        """(flag, value) where the stray `word` follows the value of a flag that takes
        exactly one."""
        words = self._words
        for index in range(2, len(words)):
            if words[index] == word:
                action = self._option_string_actions.get(words[index - 2])
                if action is not None and action.nargs is None and action.option_strings:
                    return words[index - 2], words[index - 1]
        return None

    def error(self, message: str) -> NoReturn:
        # argparse: "argument --num-layers: 'x' is not a whole number" -> "--num-layers 'x'
        # is not a whole number", the flag as typed where it has two spellings.
        if message.startswith("argument "):
            names, _, rest = message.removeprefix("argument ").partition(": ")
            flag = self._typed(names.split("/"))
            if rest.startswith("invalid choice: "):
                value, _, choices = rest.removeprefix("invalid choice: ").partition(
                    " (choose from ")
                rest = (f"{value.strip()} is not one of "
                        f"{choices.rstrip(')').replace(chr(39), '')}; use one of those")
            elif rest.startswith("expected "):
                rest = "needs a value; give it after the flag"
            elif rest.startswith("ignored explicit argument"):
                rest = "takes no value; write the flag alone"
            if rest.startswith("'$"):
                rest += " (a shell variable the launch text does not set: set it there)"
            message = f"{flag} {rest}"
            raise LaunchLineError(message, word=flag)
        raise LaunchLineError(message)

    def _typed(self, names: list[str]) -> str:
        for word in getattr(self, "_words", []):
            if word.split("=", 1)[0] in names:
                return word.split("=", 1)[0]
        return names[0]


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _text(text: str) -> str:
    return text


def _enum(text: str) -> str:
    """An enum flag's value: `flash` (also as Megatron prints it, `AttnBackend.flash`)."""
    return text.rpartition(".")[2]


def layer_pattern(text: str) -> int | list[int]:
    """A layer-frequency value as Megatron-LM's `moe_freq_type` reads it (--moe-layer-freq,
    --window-attn-skip-freq): a whole number N, or a Python list expression of 0/1 such as
    "([0]*3+[1]*58)" (megatron/training/arguments.py `_eval_pattern`). Megatron-LM `eval`s
    the expression after checking its characters; here it is walked as a syntax tree of
    list literals, +, * and whole numbers, and nothing else is run."""
    text = text.strip()
    if "[" not in text and text.lstrip("-").isdigit():
        return int(text)
    if re.search(r"[^,\d\[\]()+*\s]", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a whole number nor a list pattern such as ([0]*3+[1]*58)")
    try:
        value = _pattern_value(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, RecursionError):
        value = None
    if not isinstance(value, list):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list pattern such as ([0]*3+[1]*58)")
    return value


def _pattern_value(node: ast.AST) -> int | list[int]:
    """The value of one node of a layer pattern: whole numbers, lists of them, + and *."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.List):
        items = [_pattern_value(item) for item in node.elts]
        if all(isinstance(item, int) for item in items):
            return items  # type: ignore[return-value]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _pattern_value(node.left), _pattern_value(node.right)
        if isinstance(node.op, ast.Add) and type(left) is type(right):
            return _bounded(left + right)  # type: ignore[operator]
        if isinstance(node.op, ast.Mult) and isinstance(left, list) != isinstance(right, list):
            items, count = (left, right) if isinstance(left, list) else (right, left)
            if not 0 <= count <= _MOST_LAYERS or len(items) * count > _MOST_LAYERS:
                raise ValueError("longer than any model's layers")
            return items * count
        if isinstance(node.op, ast.Mult) and isinstance(left, int):
            return _bounded(left * right)  # type: ignore[operator]
    raise ValueError("not a layer pattern")


# The longest pattern read: the most layers `plan` takes (--num-layers' bound).
_MOST_LAYERS = VALUE_FLAGS["--num-layers"][1]


def _bounded(value: int | list[int]) -> int | list[int]:
    if isinstance(value, list) and len(value) > _MOST_LAYERS or (
            isinstance(value, int) and value > _MOST_LAYERS):
        raise ValueError("longer than any model's layers")
    return value


def _int_tuple(text: str) -> tuple[int, ...]:
    """Megatron-LM's `tuple_type` (--window-size): "128,0" or "(128,0)" -> (128, 0)."""
    try:
        return tuple(int(item) for item in text.strip().strip("()").split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not whole numbers separated by commas, such as 128,0") from None


# The reference's value types -> converters; others (Megatron's own parsers of other
# patterns) are kept as text: Tessel reads none of those flags' values.
_CONVERTERS = {"int": _integer, "float": _number, "str": _text, "enum_type_handler": _enum,
               "moe_freq_type": layer_pattern, "tuple_type": _int_tuple}


def _choice(choice: Any, convert: Any) -> Any:
    try:
        return convert(str(choice))
    except argparse.ArgumentTypeError:
        return choice


def _default(option: dict[str, Any]) -> Any:
    """The option's default as a value: '<AttnBackend.auto: 5>' -> 'auto'."""
    default = option["default"]
    if isinstance(default, str):
        enum = re.fullmatch(r"<\w+\.(\w+): .*>", default)
        if enum:
            return enum[1]
    return default


@functools.lru_cache(maxsize=4)
def _parser_for(path: str) -> MegatronParser:
    try:
        options = json.loads(Path(path).read_text())["options"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise LaunchLineError(
            f"cannot read Megatron-LM's option list {path!r} ({error}); set {ARGUMENTS_ENV} "
            "to a valid megatron_lm_arguments.json"
        ) from None
    return MegatronParser(options)


def megatron_parser() -> MegatronParser:
    """Megatron-LM's parser, built once per option list."""
    return _parser_for(str(arguments_file().resolve()))


@dataclass(frozen=True)
class MegatronArgs:
    """A launch line's flags as Megatron-LM parses them."""

    values: argparse.Namespace
    """Every option's value: the one given, or Megatron-LM's default."""
    typed: dict[str, str]
    """dest -> the flag as typed, for every option the line gives."""
    defaults: dict[str, Any]
    """dest -> Megatron-LM's default."""
    names: dict[str, str]
    """dest -> its first flag, for options the line does not give."""
    valueless: dict[str, str] = field(default_factory=dict)
    """dest -> the flag as typed, for each flag given without the value it takes (read as
    absent; `megatron_run` refuses those it reads)."""

    def given(self, dest: str) -> bool:
        """Whether the line gives the option (in any spelling)."""
        return dest in self.typed

    def flag(self, dest: str) -> str:
        """The flag as typed, or its first spelling when the line does not give it."""
        return self.typed.get(dest) or self.names.get(dest, "--" + dest.replace("_", "-"))

    def count(self, dest: str, largest: int | None = None) -> int | None:
        """A positive count flag's value (None when absent), bounded as `plan` bounds it
        (or by `largest`)."""
        value = getattr(self.values, dest)
        if value is None:
            return None
        largest = largest or _LARGEST.get(dest, 1 << 17)
        if not 1 <= value <= largest:
            raise LaunchLineError(
                f"{self.flag(dest)} {value} must be from 1 to {largest:,}; give a count "
                "in range"
            )
        return value


def parse_megatron_flags(words: Sequence[str]) -> MegatronArgs:
    """`words` (a launch line's flags) as Megatron-LM's argument parser reads them."""
    parser = megatron_parser()
    missing = parser.valueless(words)
    valueless = {parser.dest_of[words[i]]: words[i] for i in missing}
    words = [word for i, word in enumerate(words) if i not in missing]
    values = parser.parse_flags(words)
    typed: dict[str, str] = {}
    for word in words:
        name = word.split("=", 1)[0]
        if name in parser.dest_of:
            typed.setdefault(parser.dest_of[name], name)
    return MegatronArgs(values, typed, parser.defaults_of, parser.flag_of, valueless)
