"""Built-in reference models used by the CLI (``plan demo:NAME``), docs and tests.

- `demo`: small hand-written demos (an MLP, a GPT), each a factory of model and inputs.
- `config`: `TransformerConfig`, a decoder's shape in Megatron-LM's vocabulary, with an
  exact `num_parameters()`.
- `transformer`: one decoder that builds GPT, Llama and Mixtral shapes from a config
  (`build_model`, on the meta device by default, and `example_inputs`).
- `presets`: published shapes by name (`PRESETS`, `get_preset`, `describe_presets`).
"""
