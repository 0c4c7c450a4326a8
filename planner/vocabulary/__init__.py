"""The words every layer of Tessel speaks: the Plan and its schema's migrations, clusters
(with their devices' fitted efficiency and run costs), parallel configurations and their
degrees, mesh axes, the text form of placements. Nothing here searches, prices or runs, and
nothing here imports from above it: below it is only `planner.models` (pyproject.toml's
import-linter contract)."""
