"""Benchmark harness: presets (data), methods (columns), timing, runner, report, CLI."""
