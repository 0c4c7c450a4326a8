"""The compact string form of DTensor placements, read without torch: 'S(0)R' is
Shard(0) on the first mesh axis and Replicate() on the second; 'P' (or 'P(avg)') is a
partial sum, '_S(0,2)' a strided shard (dim 0 split again inside a split by 2). Plans
store placements in this form; `passes.dtensor_rules.parse_placements` turns the pieces
into DTensor's objects."""

from __future__ import annotations


def placement_pieces(text: str) -> list[tuple[str, str]]:
    """'S(0)_S(1,2)RP(avg)' -> [('S', '0'), ('_S', '1,2'), ('R', ''), ('P', 'avg')]: each
    mesh axis's kind and argument. ValueError naming the position that does not parse."""
    out: list[tuple[str, str]] = []
    i = 0
    while i < len(text):
        kind = next((k for k in ("_S(", "S(", "P(") if text.startswith(k, i)), None)
        if kind is not None:
            end = text.find(")", i)
            if end < 0:
                raise ValueError(f"cannot parse placement {text!r} at position {i}")
            out.append((kind[:-1], text[i + len(kind):end]))
            i = end + 1
        elif text[i] in "RP":
            out.append((text[i], ""))
            i += 1
        else:
            raise ValueError(f"cannot parse placement {text!r} at position {i}")
    return out
