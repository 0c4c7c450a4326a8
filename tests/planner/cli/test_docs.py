"""The README and docs/ against the command line they describe: every `plan ...` line they
show names a command that exists and only flags its parser has, `plan --help` names every
command, docs/cli.md names every flag, and the README stays a short page that links the
reference. In-process and parse-only: nothing is planned or trained."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from planner.cli.errors import UsageError
from planner.cli.main import COMMANDS, build_parsers, main

REPO = Path(__file__).resolve().parents[3]
README = REPO / "README.md"
DOC_PAGES = ("cli.md", "cost-models.md", "runtime.md", "graph-plans.md", "plan-schema.md")
PAGES = [README, *(REPO / "docs" / name for name in DOC_PAGES)]
PARSERS = build_parsers()
# Values the examples name that are not on this machine (a launch script, a TOML job
# config): these lines' flags are still checked one by one, only not parsed whole.
NEEDS_FILES = {"launch.sh", "llama3_405b.toml", "runs.csv", "prof.json"}


def _shell_lines(text: str) -> list[str]:
    """The lines of the page's ```bash blocks, continuations joined, comments dropped."""
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        pending = ""
        for raw in block.splitlines():
            line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
            if line.endswith("\\"):
                pending += line[:-1] + " "
                continue
            if (pending + line).strip():
                lines.append((pending + line).strip())
            pending = ""
    return lines


def _plan_lines(path: Path) -> list[list[str]]:
    """Each `plan ...` command line a page shows, as words after `plan`."""
    return [shlex.split(line)[1:] for line in _shell_lines(path.read_text())
            if line.startswith("plan ")]


def _command_of(words: list[str]) -> str:
    return words[0] if words and words[0] in COMMANDS and words[0] else ""


EXAMPLES = [(path.relative_to(REPO).as_posix(), words)
            for path in PAGES for words in _plan_lines(path)]


def test_the_pages_show_command_lines() -> None:
    # The extraction itself: if it found nothing, every test below would pass vacuously.
    assert all(path.exists() for path in PAGES), [str(p) for p in PAGES if not p.exists()]
    shown = {_command_of(words) for _, words in EXAMPLES}
    assert {"", "check", "predict"} <= shown
    assert len(EXAMPLES) >= 30


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_has_a_help_that_exits_0(command: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        main([command, "--help"] if command else ["--help"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("usage: plan")


@pytest.mark.parametrize(("page", "words"), EXAMPLES,
                         ids=[f"{page}:{' '.join(words)[:60]}" for page, words in EXAMPLES])
def test_every_flag_shown_exists(page: str, words: list[str]) -> None:
    command = _command_of(words)
    parser = PARSERS[command]
    known = {option for action in parser._actions for option in action.option_strings}
    args = words[1:] if command else words
    if "--" in args:  # `plan predict ... -- MEGATRON_FLAGS`: Megatron-LM's, not ours
        args = args[:args.index("--")]
    unknown = [word.split("=", 1)[0] for word in args
               if word.startswith("--") and word.split("=", 1)[0] not in known]
    assert not unknown, f"{page}: `plan {' '.join(words)}` shows {unknown}, which " \
        f"`plan {command} --help` does not have".replace("plan  ", "plan ")


@pytest.mark.parametrize(("page", "words"), EXAMPLES,
                         ids=[f"{page}:{' '.join(words)[:60]}" for page, words in EXAMPLES])
def test_every_example_parses(page: str, words: list[str]) -> None:
    """The whole line through the command's own (strict) parser: values too, and
    positionals, as a user pasting it would meet them."""
    if "..." in words or NEEDS_FILES & set(words):
        pytest.skip("a placeholder or a file not on this machine; flags checked above")
    command = _command_of(words)
    try:
        PARSERS[command].parse_args(words[1:] if command else words)
    except UsageError as error:
        pytest.fail(f"{page}: `plan {' '.join(words)}`: {error}")


def test_plan_help_names_every_command(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = capsys.readouterr().out
    listed = re.search(r"^commands.*?\n((?:  \S.*\n)+)", help_text, flags=re.M)
    assert listed, "plan --help has no commands section"
    named = [line.split()[0] for line in listed.group(1).splitlines()]
    assert named == [name for name in COMMANDS if name]
    assert "--global-batch-size" in help_text  # still the planning flags' page


def test_cli_reference_names_every_flag() -> None:
    reference = (REPO / "docs" / "cli.md").read_text()
    missing = {
        f"plan {name}".strip(): sorted(
            option for action in parser._actions for option in action.option_strings
            if option.startswith("--") and option != "--help"
            and not re.search(rf"`{re.escape(option)}[` ]", reference))
        for name, parser in PARSERS.items()
    }
    missing = {command: flags for command, flags in missing.items() if flags}
    assert not missing, f"docs/cli.md does not describe {missing}: add them to its flag " \
        "tables (the parsers' help texts)"


def test_readme_is_short_and_links_every_docs_page() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 160
    for name in DOC_PAGES:
        assert f"](docs/{name})" in text, f"README.md does not link docs/{name}"


def test_docs_links_point_at_pages_that_exist() -> None:
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links {target}"
