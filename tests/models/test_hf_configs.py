"""`hf:config.json` specs: tiny configs of six families load on meta and trace into layers.

Each family is a random 4-block config (hidden 64, 4 heads, vocab 128) written to a
temporary config.json, so nothing is downloaded. A family's model must trace without
materialising a parameter, come out as one embedding, four blocks of one template and one
head, count a tied embedding once, and, traced at two blocks and expanded, describe the same
layers as a trace at full depth. Bad config files raise ModelSpecError.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from torch import nn

pytest.importorskip("transformers")

from passes.layers import Layer  # noqa: E402
from passes.model_graph import TRACED_BLOCKS, ModelGraph, trace_model  # noqa: E402
from planner.models.sources import LoadedModel, ModelSpecError, load_model  # noqa: E402
from planner.models.hf_shape import to_transformer_config  # noqa: E402
from tests.models.hf_tiny import decoder_config_json  # noqa: E402

BLOCKS = 4
SHAPE = {"seq_length": 16}


def decoder_config(model_type: str, architecture: str, **extra: Any) -> dict[str, Any]:
    """A Llama-style decoder with grouped-query attention (2 key/value heads)."""
    return decoder_config_json(
        BLOCKS, model_type=model_type, architectures=[architecture], **extra)


def gpt2_config() -> dict[str, Any]:
    """GPT-2 with its default tied LM head."""
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_layer": BLOCKS,
        "n_embd": 64,
        "n_head": 4,
        "vocab_size": 128,
        "n_positions": 64,
        # The defaults (50256) lie outside the tiny vocabulary and make transformers warn.
        "bos_token_id": 127,
        "eos_token_id": 127,
    }


def bert_config() -> dict[str, Any]:
    """BERT with its masked-LM head (decoder weight tied to the word embedding)."""
    return {
        "model_type": "bert",
        "architectures": ["BertForMaskedLM"],
        "num_hidden_layers": BLOCKS,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "vocab_size": 128,
        "max_position_embeddings": 64,
    }


class Family(NamedTuple):
    config: Callable[[], dict[str, Any]]
    blocks: str
    """Module path of the repeated blocks' ModuleList (names end in .0 ... .3)."""
    tied: bool
    """Whether a parameter is registered under two names (a tied embedding and head)."""


FAMILIES = {
    "gpt2": Family(gpt2_config, "hf_model.transformer.h", tied=True),
    "llama": Family(
        lambda: decoder_config("llama", "LlamaForCausalLM"), "hf_model.model.layers", False
    ),
    "mistral": Family(
        lambda: decoder_config("mistral", "MistralForCausalLM"), "hf_model.model.layers", False
    ),
    "qwen2": Family(
        lambda: decoder_config("qwen2", "Qwen2ForCausalLM"), "hf_model.model.layers", False
    ),
    "mixtral": Family(
        lambda: decoder_config(
            "mixtral", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2
        ),
        "hf_model.model.layers",
        False,
    ),
    # BertForMaskedLM builds BERT without its pooler, so the layers are the embeddings, the
    # encoder blocks and a "head" holding the MLM transform and decoder, as for the decoders.
    "bert": Family(bert_config, "hf_model.bert.encoder.layer", tied=True),
}

class Traced(NamedTuple):
    loaded: LoadedModel
    graph: ModelGraph
    models: list[nn.Module]
    """Every model the trace built (at reduced depth, for a reduced-depth trace)."""


TraceFamily = Callable[..., Traced]
"""The `traced` fixture: `traced(family, reduced=True) -> Traced`."""


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> TraceFamily:
    """`traced(family, reduced)`: the family's loaded model and its trace, at two blocks
    expanded to four when `reduced`, else at full depth; each traced once per module."""
    cache: dict[tuple[str, bool], Traced] = {}

    def get(family: str, reduced: bool = True) -> Traced:
        if (family, reduced) not in cache:
            path = write_config(tmp_path_factory.mktemp(family), FAMILIES[family].config())
            cache[family, reduced] = _trace(family, load_model(f"hf:{path}", SHAPE), reduced)
        return cache[family, reduced]

    return get


def _trace(family: str, loaded: LoadedModel, reduced: bool) -> Traced:
    models: list[nn.Module] = []

    def build(depth: int | None) -> Any:
        built = loaded.build(depth)
        models.append(built.model)
        return built

    graph = trace_model(build, loaded.num_layers if reduced else None)
    return Traced(loaded, graph, models)


def write_config(directory: Path, fields: dict[str, Any]) -> Path:
    path = directory / "config.json"
    with path.open("w") as file:
        json.dump(fields, file)
    return path


def summary(layer: Layer) -> tuple[Any, ...]:
    """What a layer tells the planner: everything but its traced nodes and source."""
    return (
        layer.name,
        layer.template,
        layer.parameters,
        layer.num_parameters,
        layer.flops,
        layer.saved_bytes,
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_traces_on_meta_into_embedding_blocks_and_head(
    family: str, traced: TraceFamily
) -> None:
    loaded, graph, models = traced(family)
    assert loaded.num_layers == BLOCKS
    for model in (loaded.model, *models):
        assert all(p.is_meta for p in model.parameters())

    embedding, *blocks, head = graph.layers
    assert (embedding.name, head.name) == ("embedding", "head")
    assert [b.name for b in blocks] == [f"{FAMILIES[family].blocks}.{i}" for i in range(BLOCKS)]
    assert list(graph.templates) == [embedding.template, blocks[0].template, head.template]
    assert all(b.num_parameters == blocks[0].num_parameters > 0 for b in blocks)


@pytest.mark.parametrize("family", FAMILIES)
def test_parameters_are_counted_once(family: str, traced: TraceFamily) -> None:
    loaded, graph, _ = traced(family)
    model = loaded.model
    aliases = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    assert (len(aliases) > len(list(model.parameters()))) == FAMILIES[family].tied

    assert graph.num_parameters == sum(p.numel() for p in model.parameters())
    owned = [name for layer in graph.layers for name in layer.parameters]
    assert len(owned) == len(set(owned)) == len(list(model.parameters()))
    assert set(owned) <= aliases


@pytest.mark.parametrize("family", FAMILIES)
def test_traced_at_reduced_depth(family: str, traced: TraceFamily) -> None:
    _, graph, models = traced(family)
    assert graph.traced_depth == TRACED_BLOCKS == 2
    assert len(models[0].get_submodule(FAMILIES[family].blocks)) == TRACED_BLOCKS
    assert [layer.source for layer in graph.layers[1:-1]] == [
        f"{FAMILIES[family].blocks}.{i}" for i in (0, 1, 1, 1)
    ]


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_reduced_depth_matches_full_depth(family: str, traced: TraceFamily) -> None:
    reduced, full = traced(family).graph, traced(family, reduced=False).graph
    assert full.traced_depth is None
    assert [summary(layer) for layer in reduced.layers] == [
        summary(layer) for layer in full.layers
    ]


def test_directory_spec_reads_its_config_json(tmp_path: Path) -> None:
    write_config(tmp_path, FAMILIES["llama"].config())
    loaded = load_model(f"hf:{tmp_path}", SHAPE)
    assert loaded.config.model_type == "llama"
    assert loaded.num_layers == BLOCKS


@pytest.mark.parametrize(
    ("content", "fragments"),
    [
        pytest.param(None, ["does not exist"], id="missing-file"),
        pytest.param('{"model_type": "llama",\n', ["not valid JSON", "line 2"], id="bad-json"),
        pytest.param(
            json.dumps({"architectures": ["LlamaForCausalLM"]}), ["model_type"], id="no-type"
        ),
        pytest.param(
            json.dumps({"model_type": "not-a-model", "architectures": []}),
            ["model_type", "'not-a-model'"],
            id="unknown-type",
        ),
    ],
)
def test_bad_config_raises_model_spec_error(
    tmp_path: Path, content: str | None, fragments: list[str]
) -> None:
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ModelSpecError) as raised:
        load_model(f"hf:{path}", SHAPE)
    for fragment in fragments:
        assert fragment in str(raised.value)


# Qwen2's q/k/v biases have no counterpart in the zoo's bias-free Llama layout.
@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "mixtral"])
def test_zoo_shape_of_a_config_counts_its_parameters(family: str, traced: TraceFamily) -> None:
    """Training plans price a Hugging Face model by its zoo shape: same parameters."""
    loaded = traced(family).loaded
    shape = to_transformer_config(loaded.config, seq_length=16)
    assert shape.num_parameters() == sum(p.numel() for p in loaded.model.parameters())


def test_training_plan_of_a_config_takes_its_shape_flags(tmp_path: Path) -> None:
    """`--seq-length` and `--num-layers` reshape an hf: model for `--gpus` plans too: the
    plan's launch flags carry them, not the config's defaults."""
    from planner import cli

    write_config(tmp_path, FAMILIES["llama"].config())
    out = tmp_path / "plan.json"
    code = cli.main([f"hf:{tmp_path}", "--seq-length", "32", "--num-layers", "2",
                     "--cluster", "dgx-a100-80g", "--gpus", "8", "--global-batch-size", "8",
                     "--json", str(out)])
    assert code == 0
    flags = json.loads(out.read_text())["megatron_flags"]
    assert "--seq-length 32" in flags and "--num-layers 2" in flags
