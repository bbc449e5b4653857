"""The case matrix runs under the harness plugin (options, rows, crash isolation)."""
pytest_plugins = ["harness.engine.plugin"]
