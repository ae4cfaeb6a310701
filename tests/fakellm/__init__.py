"""A local fake LLM server speaking OpenAI chat-completions and Anthropic messages.

See tests/fakellm/README.md. In tests use the ``fake_llm`` fixture (tests/fakellm/plugin.py).
"""

from tests.fakellm._process import start_process
from tests.fakellm._schema import instance_for
from tests.fakellm._script import RecordedRequest, Reply, Rule
from tests.fakellm._server import FakeLLMServer

__all__ = ["FakeLLMServer", "RecordedRequest", "Reply", "Rule", "instance_for", "start_process"]
