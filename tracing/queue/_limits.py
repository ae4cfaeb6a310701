"""The message sizes producers and workers agree on. Nothing imported: the workers' settings read
the default cap without loading the queue's models and publisher."""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_PAYLOAD_BYTES", "MESSAGE_ENVELOPE_BYTES"]

# The workers' default cap on one message (TRACESCORE_MAX_PAYLOAD_BYTES defaults from it): here
# so producers know it without importing the worker.
DEFAULT_MAX_PAYLOAD_BYTES = 8 * 1024 * 1024
# Room kept in a message for what surrounds the requests' JSON: the task envelope
# ``[[{"batch_id": ..., "requests": [...]}], {}, {callbacks...}]`` (~150 bytes) and slack.
MESSAGE_ENVELOPE_BYTES = 1024
