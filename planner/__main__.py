from planner.cli.main import run

run()
