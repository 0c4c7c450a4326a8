"""The words every layer of Tessel speaks: the Plan and its schema's migrations, clusters,
parallel configurations and their degrees, mesh axes. Nothing here searches, prices or runs."""
