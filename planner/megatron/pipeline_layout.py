"""Megatron-LM's pipeline layout string (`--pipeline-model-parallel-layout`), read and
written: which layers each model chunk holds, for stages of different contents.

The form is Megatron-Core's (`megatron/core/transformer/pipeline_parallel_layer_layout.py`):
one group of layer letters per model chunk, chunks separated by `|` in virtual-stage order
(chunk c runs on pipeline rank c % pipeline); `E` the embedding, `t` a transformer layer,
`L` the loss, `m` a multi-token-prediction layer; `x*n` and `(...)*n` repeat, commas are
cosmetic. "Et*7|(t*8|)*14t*7L" is Llama 3 405B on 16 stages, the end stages one layer short.
"""

from __future__ import annotations

import re

# Megatron-Core's unrolling: a parenthesised group first, then a single letter.
_REPEATS = (re.compile(r"\(([^)]+)\)\*(\d+)"), re.compile(r"(.)\*(\d+)"))
LETTERS = "EtLm"


def chunk_layers(layout: str, mtp_layers: int = 0) -> list[int]:
    """Transformer layers of each model chunk, in model order (the `mtp_layers`
    multi-token-prediction layers, `m`, are not counted: they sit in the last chunk, before
    the loss). ValueError (one sentence) for a letter Megatron-LM does not know, an
    embedding or loss not at the ends, or MTP layers other than `mtp_layers` in the last
    chunk."""
    text = layout.replace(",", "")
    for pattern in _REPEATS:
        text = pattern.sub(lambda match: match.group(1) * int(match.group(2)), text)
    unknown = sorted(set(text) - set(LETTERS) - {"|"})
    if unknown:
        raise ValueError(f"has {', '.join(map(repr, unknown))}, not one of E (embedding), "
                         "t (transformer layer), L (loss), m (multi-token prediction)")
    letters = text.replace("|", "")
    if not letters or letters[0] != "E" or letters[-1] != "L" or letters.count("E") != 1 \
            or letters.count("L") != 1:
        raise ValueError("must begin with the embedding E and end with the loss L, once each, "
                         "as Megatron-LM requires")
    chunks = text.split("|")
    # Megatron-Core (PipelineParallelLayerLayout.validate_layer_layout) needs as many m as
    # --mtp-num-layers, after every decoder layer; it also lets them stand alone in another
    # rank's last virtual stage, which Tessel does not price: they go with the loss.
    found = letters.count("m")
    if found != mtp_layers:
        raise ValueError(f"places {found} multi-token-prediction layers (m), and "
                         f"--mtp-num-layers is {mtp_layers}; place as many as it says")
    if chunks[-1].count("m") != found or "t" in chunks[-1].partition("m")[2]:
        raise ValueError("places multi-token-prediction layers (m) outside the last stage "
                         "or before a transformer layer, which Tessel does not price; put "
                         "them just before L")
    return [chunk.count("t") for chunk in chunks]


def layout_string(chunks: list[int], mtp_layers: int = 0) -> str:
    """The layout string of chunks of `chunks` transformer layers (model order), the
    embedding in the first and the `mtp_layers` MTP layers and the loss in the last, runs
    of equal chunks folded (only middle chunks repeat: the first holds E, the last L)."""
    groups = [f"t*{n}" if n > 1 else "t" * n for n in chunks]
    groups[0] = "E" + groups[0]
    groups[-1] = groups[-1] + "m" * mtp_layers + "L"
    folded: list[str] = []
    index = 0
    while index < len(groups):
        run = 1
        while index + run < len(groups) and groups[index + run] == groups[index]:
            run += 1
        folded.append(f"({groups[index]}|)*{run}" if run > 1 else f"{groups[index]}|")
        index += run
    return "".join(folded).removesuffix("|")
