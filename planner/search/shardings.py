"""An intra-op solution as the Plan records it: every node's strategy, every parameter's
placement, the gradient buckets and the collectives by phase."""

from __future__ import annotations

from passes.dtensor_rules import placement_str
from passes.lower import graph_fingerprint
from passes.strategies import NodeStrategies, fallback_nodes
from passes.program import TracedProgram
from planner.vocabulary.plan import (
    PHASES,
    CollectiveStats,
    FallbackOp,
    GradientBucket,
    NodeSharding,
    OperatorShardings,
    SolverReport,
)
from planner.search.intra_op import IntraOpSolution


def operator_shardings(
    program: TracedProgram, table: dict[str, NodeStrategies], solution: IntraOpSolution,
    buckets: list[GradientBucket] | None = None,
) -> tuple[dict[str, str], OperatorShardings]:
    """(parameter FQN -> placement, the node shardings) of `solution`; `buckets` replace
    the solution's gradient buckets where the caller regrouped them."""

    def chosen(node: str):
        return table[node].strategies[solution.choices[node]]

    nodes = {}
    for node, strategies in table.items():
        if strategies.kind in ("parameter", "buffer", "input"):
            continue
        s = chosen(node)
        meta = program.nodes[node].meta
        nodes[node] = NodeSharding(
            op=str(program.nodes[node].target),
            module=meta.get("tessel_module", ""),
            phase=meta.get("tessel_phase", "forward"),
            inputs=[placement_str(p) for p in s.inputs],
            outputs=[placement_str(p) if p is not None else None for p in s.outputs],
            produced=placement_str(s.produced) if s.produced is not None else None,
        )
    parameters = {
        fqn: placement_str(chosen(node).outputs[0]) for node, fqn in program.parameters.items()
    }
    operators = OperatorShardings(
        graph_fingerprint=graph_fingerprint(program),
        inputs={node: placement_str(chosen(node).outputs[0]) for node in program.user_inputs},
        nodes=nodes,
        gradient_buckets=(buckets if buckets is not None
                          else [GradientBucket(**vars(b)) for b in solution.buckets]),
        communication_by_phase={p: stats(solution.collectives_by_kind(p)) for p in PHASES},
        fallback_ops=[
            FallbackOp(node=n, op=nodes[n].op, module=nodes[n].module)
            for n in fallback_nodes(table)
        ],
        replicated=solution.replicated,
        solver=SolverReport(
            backend="SCIP",
            status=solution.assignment.status,
            gap=solution.assignment.gap,
            solve_time_s=solution.assignment.solve_time_s,
            num_variables=solution.num_variables,
        ),
    )
    return parameters, operators


def stats(table: dict[str, dict[str, int]]) -> dict[str, CollectiveStats]:
    return {kind: CollectiveStats(**v) for kind, v in table.items()}
