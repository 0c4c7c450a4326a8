"""A zoo transformer planned with `--intra-op ilp`: traced at reduced depth, its stages run
their layers as programs of their own (`planner.search.layered_stage`), as the runtime
runs them exactly as predicted, collective for collective. (A model of one's own planned
that way: test_graph_plans.)"""

from __future__ import annotations

from pathlib import Path


def test_a_zoo_transformer_under_intra_op_ilp_is_planned_as_any_model(tmp_path) -> None:
    """`plan check gpt ... --gpus 4 --intra-op ilp`: the transformer is traced with four of
    its six blocks and planned from its graph, as a model of one's own is; its stages run
    their layers' programs (the runtime traces all six blocks), and 4 gloo ranks train it
    as one process does, every rank's collectives as predicted."""
    from planner import cli
    from planner.vocabulary.plan import Plan

    out = tmp_path / "report.json"
    assert cli.main([
        "check", "gpt", "--num-layers", "6", "--hidden-size", "64",
        "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "128",
        "--cluster", str(Path(__file__).parents[1] / "fixtures" / "small_memory.yaml"),
        "--gpus", "4", "--global-batch-size", "16", "--micro-batch-size", "4",
        "--intra-op", "ilp", "--steps", "2", "--json", str(out)]) == 0
    import json

    report = json.loads(out.read_text())
    plan = Plan.model_validate(report["plan"])
    assert plan.layer_cuts is not None and len(plan.layer_cuts) == 9  # 6 blocks and ends
    assert len(plan.stages) > 1 and all(s.layer_operators for s in plan.stages)
    held = {fqn for stage in plan.stages for fqn in stage.parameters}
    assert {f"layers.{i}.mlp.fc1.weight" for i in range(6)} <= held
    assert report["details"]["passed"] and report["details"]["communication_matches"]
    assert report["details"]["max_rel_error"] < 1e-4


def test_a_hugging_face_config_under_intra_op_ilp_is_planned_as_any_model(tmp_path) -> None:
    """`plan check hf:config.json --gpus 4 --intra-op ilp`: a transformers Llama, whose
    causal mask every decoder layer reads, is cut between its layers (each stage makes the
    mask again from the positions rather than receiving it), pipelined, and 4 gloo ranks
    train it as one process does, every rank's collectives as predicted."""
    import json

    from planner import cli
    from planner.vocabulary.plan import Plan

    config = tmp_path / "tinyllama" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 6,
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64}))
    out = tmp_path / "report.json"
    assert cli.main([
        "check", f"hf:{config}", "--cluster", "cpu", "--gpus", "4", "--global-batch-size",
        "8", "--micro-batch-size", "1", "--intra-op", "ilp", "--steps", "2",
        "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    plan = Plan.model_validate(report["plan"])
    assert plan.layer_cuts is not None and len(plan.layer_cuts) == 9  # 6 layers and ends
    assert len(plan.stages) > 1
    assert report["details"]["passed"] and report["details"]["communication_matches"]
    assert report["details"]["max_rel_error"] < 1e-4
