"""The tools around the package: CLI, metrics, load-test short forms, examples, packaging, layout, typing."""
