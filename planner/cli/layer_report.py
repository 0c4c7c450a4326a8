"""`plan inspect`: what the planner sees in a model, before any planning.

Consecutive layers of one template are one row ("layers.0 .. layers.95 x 96"), with the
template's forward op count, parameters, forward FLOPs and saved activation bytes per
token. The totals, the ops without a sharding rule and the trace time follow.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from passes.model_graph import ModelGraph


@dataclass(frozen=True)
class LayerRow:
    """One run of consecutive layers that share a template."""

    first: str
    """Name of the first layer of the run."""
    last: str
    """Name of the last layer of the run (the same as `first` for a single layer)."""
    count: int
    """Layers in the run."""
    template: str
    """Structural hash of the layers' forward subgraph."""
    forward_ops: int
    """Forward aten ops of one layer."""
    parameters: int
    """Parameters of one layer."""
    flops_per_token: float
    """Forward FLOPs of one layer per token (backward adds about twice as many)."""
    activation_bytes_per_token: float
    """Bytes of one layer's forward values kept for the backward, per token."""


@dataclass(frozen=True)
class InspectReport:
    """Everything `plan inspect` prints."""

    model: str
    """The model as named on the command line."""
    rows: list[LayerRow]
    """Layers in forward order, runs of one template merged."""
    num_layers: int
    """Layers in the model (embedding and head included)."""
    num_templates: int
    """Distinct templates."""
    num_parameters: int
    """Parameters of the whole model (shared ones once)."""
    ops_without_rule: list[str]
    """Ops with no sharding rule: they run replicated."""
    traced_blocks: int | None
    """Blocks traced, when the model was traced at reduced depth; None if traced whole."""
    trace_s: float
    """Wall time of tracing."""
    layers_s: float
    """Wall time of finding layers and templates."""

    def to_dict(self) -> dict:
        return asdict(self)


def inspect_report(name: str, graph: ModelGraph) -> InspectReport:
    rows: list[LayerRow] = []
    tokens = max(graph.tokens, 1)
    for layer in graph.layers:
        previous = rows[-1] if rows else None
        if previous is not None and previous.template == layer.template:
            rows[-1] = replace(previous, last=layer.name, count=previous.count + 1)
            continue
        rows.append(LayerRow(
            first=layer.name,
            last=layer.name,
            count=1,
            template=layer.template,
            forward_ops=len(layer.nodes),
            parameters=layer.num_parameters,
            flops_per_token=layer.flops / tokens,
            activation_bytes_per_token=layer.saved_bytes / tokens,
        ))
    return InspectReport(
        model=name,
        rows=rows,
        num_layers=len(graph.layers),
        num_templates=len(graph.templates),
        num_parameters=graph.num_parameters,
        ops_without_rule=graph.ops_without_rule(),
        traced_blocks=graph.traced_depth,
        trace_s=graph.trace_s,
        layers_s=graph.layers_s,
    )
