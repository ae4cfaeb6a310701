"""Shared fixtures: the fake LLM server plugin is loaded for every test directory."""

pytest_plugins = ["tests.fakellm.plugin"]
