"""pytest fixtures for the fake LLM server (filled in by the judge work)."""
