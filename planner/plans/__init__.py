"""Plans made from searches: a transformer's training plans (`transformer_plan`), a graph plan
(`graph_plan`), and a training plan's whole-run totals (`totals`)."""
