"""Plans made from searches: a transformer's training plans (`training`), a graph plan
(`graph`), and a training plan's whole-run totals (`totals`)."""
