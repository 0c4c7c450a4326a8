"""passes.emit: a user-supplied string cannot change what an emitted `rankN.py` runs.

The model name lands in each file's header comment; a name with a line break must stay
inside the comment (as its repr), so that running the file does nothing but import torch
and define `forward`. Parameter and module paths never reach the code (FX names the
placeholders by position), and a program whose top level is anything else is refused.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from passes.emit import emit_rank_programs, rank_program_source
from planner.api import plan_model
from planner.models import demo

PAYLOAD = "open('MARKER', 'w').write('injected')"
HOSTILE = f"x\n{PAYLOAD}\n#"


@pytest.fixture(scope="module")
def planned():
    torch.manual_seed(0)
    model, inputs = demo.mlp(batch=8, in_features=16, hidden=32, out_features=8)
    return plan_model(model, inputs, mesh_shape=(2,), name=HOSTILE)


def top_level(source: str) -> list[str]:
    return [type(node).__name__ for node in ast.parse(source).body]


def test_a_hostile_model_name_cannot_add_code_to_the_emitted_programs(
    planned, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = emit_rank_programs(planned.program, planned.plan, tmp_path / "code")
    assert [p.name for p in paths] == ["rank0.py", "rank1.py"]
    monkeypatch.chdir(tmp_path)
    for path in paths:
        text = path.read_text()
        lines = text.splitlines()
        assert lines[0].startswith("# Rank ") and repr(HOSTILE) in lines[0]
        assert HOSTILE not in text and not any(line.startswith(PAYLOAD) for line in lines)
        assert top_level(text) == ["Import", "ImportFrom", "FunctionDef"]
        namespace: dict = {}
        exec(compile(text, str(path), "exec"), namespace)  # what `python rankN.py` runs
        assert not (tmp_path / "MARKER").exists()
        assert sorted(k for k in namespace if not k.startswith("__")) == [
            "device", "forward", "torch"]
        # Parameter paths are not in the code: the graph takes positional placeholders.
        for fqn in planned.plan.parameters:
            assert fqn not in text


@pytest.mark.parametrize(
    "name",
    [HOSTILE, f"x\r{PAYLOAD}", f"x\r\n{PAYLOAD}", f"x\u2028{PAYLOAD}", f"x\x0c\n{PAYLOAD}",
     "x'\"\\\n" + PAYLOAD],
    ids=["newline", "carriage-return", "crlf", "line-separator", "form-feed", "quotes"],
)
def test_every_line_break_in_a_name_stays_in_the_comment(planned, name: str) -> None:
    plan = planned.plan.model_copy(update={"model": name})
    source = rank_program_source(plan, 0, "\n\ndef forward(self, x):\n    return x\n")
    header = source.split("import torch\n", 1)[0]
    assert all(line.startswith("#") for line in header.splitlines())
    assert len(header.splitlines()) == 3
    assert top_level(source) == ["Import", "ImportFrom", "FunctionDef"]


@pytest.mark.parametrize(
    "code",
    [
        f"\n\n{PAYLOAD}\ndef forward(self, x):\n    return x\n",
        f"\n\ndef forward(self, x=({PAYLOAD})):\n    return x\n",
        "\n\n@print\ndef forward(self, x):\n    return x\n",
        f"\n\ndef forward(self, x: {PAYLOAD}):\n    return x\n",
    ],
    ids=["statement", "default", "decorator", "annotation"],
)
def test_a_program_that_would_run_more_than_define_forward_is_refused(planned, code) -> None:
    with pytest.raises(ValueError, match="refusing to write it"):
        rank_program_source(planned.plan, 0, code)


def test_every_name_forward_reads_is_defined_by_the_file(planned, tmp_path: Path) -> None:
    """The emitted program is complete: no free name (FX writes `device(type='cpu')`)."""
    for path in emit_rank_programs(planned.program, planned.plan, tmp_path / "code"):
        tree = ast.parse(path.read_text())
        forward = tree.body[-1]
        read = {n.id for n in ast.walk(forward) if isinstance(n, ast.Name)
                and isinstance(n.ctx, ast.Load)}
        bound = {a.arg for a in forward.args.args} | {
            t.id for n in ast.walk(forward) if isinstance(n, ast.Assign)
            for t in n.targets if isinstance(t, ast.Name)
        }
        imported = {alias.asname or alias.name for node in tree.body[:-1] for alias in node.names}
        assert read - bound <= imported, read - bound - imported
