"""TorchTitan's command-line overrides of a job (`--parallelism.tensor_parallel_degree 8`).

Both releases override a job's fields by their dotted names after the config: 0.2 after
`--job.config_file` (torchtitan/config/manager.py: `ConfigManager.parse_args`), 0.3 after
`--module M --config F` (the same function, by tyro). `plan predict --torchtitan CONFIG --
WORDS` reads WORDS as those overrides:

- `--section.field VALUE` or `--section.field=VALUE`, the value typed by the field's
  default (a list of names comma-separated, as TorchTitan's `list_str_rule` reads it;
  `None` for an optional field);
- a true/false field as a switch: `--compile.enable`, `--compile.no-enable` (tyro's
  form), or followed by True / False;
- 0.3's checkpointing policy as tyro's subcommand: `activation_checkpoint:full` (also
  `selective`, `memory-budget`, `none`; hyphens and underscores alike).

A name the release does not have is refused by name, with the nearest it has.
"""

from __future__ import annotations

import difflib
from typing import Any

from planner.torchtitan.errors import JobConfigError
from planner.torchtitan.keys import Key

SUBCOMMAND = "activation_checkpoint:"


def parse_overrides(words: list[str], keys: dict[str, Key], free: tuple[str, ...],
                    release: str) -> dict[str, Any]:
    """{dotted key: value} of the override `words` against `keys` (the release's fields,
    each with its default) and the `free` sections (any field, kept as typed)."""
    given: dict[str, Any] = {}
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        plain = word.replace("-", "_")
        if plain.startswith(SUBCOMMAND) or plain.startswith("__" + SUBCOMMAND):
            if release == "0.2":
                raise _error(word, "is TorchTitan 0.3's form; 0.2 reads "
                             "--activation_checkpoint.mode")
            given["activation_checkpoint"] = plain.split(":", 1)[1]
            continue
        if not word.startswith("--") or "." not in word.split("=", 1)[0]:
            if word.startswith("--") and word.split("=")[0] not in ("--module", "--config"):
                raise JobConfigError(
                    f"{word} is a Megatron-LM flag, not a TorchTitan override: --torchtitan "
                    "reads a TorchTitan job, and Megatron-LM's flags start another run; give "
                    "one of the two")
            raise _error(word, "is not an override (--section.field VALUE); give the config "
                         "as --torchtitan NAME and its overrides after --")
        name, has_value, text = word[2:].partition("=")
        section, _, field = name.partition(".")
        section = section.replace("-", "_")
        if section == "model" and release != "0.2":
            raise _error(word, "has no place: TorchTitan 0.3 takes the model from the "
                         "config function's model_registry(...) call, not its command line; "
                         "name another config or write a config module")
        if section in free:
            if not has_value:
                if index >= len(words):
                    raise _error(word, "needs a value")
                text, index = words[index], index + 1
            given[f"{section}.{field}"] = text
            continue
        key, negated = _key(section, field, keys, word, release)
        spec = keys[key]
        if isinstance(spec.default, bool) or negated:
            value, index = _switch(words, index, text if has_value else None, word)
            given[key] = (not value) if negated else value
            continue
        if not has_value:
            if index >= len(words) or words[index].startswith("--"):
                raise _error(word, "needs a value")
            text, index = words[index], index + 1
        given[key] = _typed(text, spec.default, word)
    return given


def _key(section: str, field: str, keys: dict[str, Key], word: str,
         release: str) -> tuple[str, bool]:
    """The dotted key of `section.field` (hyphens read as underscores), and whether it was
    given negated (`no_` before a true/false field's name)."""
    field = field.replace("-", "_")
    key = f"{section}.{field}"
    if key in keys:
        return key, False
    if field.startswith("no_") and isinstance(keys.get(f"{section}.{field[3:]}",
                                                       Key(None)).default, bool):
        return f"{section}.{field[3:]}", True
    near = difflib.get_close_matches(key, list(keys), n=1, cutoff=0.75)
    hint = f" (did you mean --{near[0]}?)" if near else ""
    raise _error(word.split("=")[0], f"is not an option of TorchTitan {release}'s command "
                 f"line{hint}; fix or remove it")


def _switch(words: list[str], index: int, text: str | None,
            word: str) -> tuple[bool, int]:
    """A true/false override: its value and the index of the next word."""
    if text is None and index < len(words) and words[index].lower() in ("true", "false"):
        text, index = words[index], index + 1
    if text is None:
        return True, index
    if text.lower() not in ("true", "false"):
        raise _error(word, f"takes True or False, not {text!r}")
    return text.lower() == "true", index


def _typed(text: str, default: Any, word: str) -> Any:
    """`text` as the type of the field's default."""
    if text == "None" and not isinstance(default, str):
        return None
    try:
        if isinstance(default, list):
            return [item for item in text.split(",") if item]
        if isinstance(default, float):
            return float(text)
        if isinstance(default, int) or default is None and text.lstrip("-").isdigit():
            return int(text)
    except ValueError:
        kind = "a number" if isinstance(default, (int, float)) else "a value"
        raise _error(word, f"takes {kind}, not {text!r}") from None
    return text


def _error(word: str, text: str) -> JobConfigError:
    return JobConfigError(f"override {word} {text}")
