"""Peak memory of one judge call whose 200 answer is a hostile or legitimate body, through the real
``openai`` / ``anthropic`` SDK over HTTP to tests/fakellm.

    .venv/bin/python bench/judge_body_memory.py [--max-tokens 1024]

Each case runs in a fresh subprocess: a first call (a plain answer) loads the SDK and builds its
client, then the measured call; the figure is the growth of the process's peak RSS
(``ru_maxrss``: 0 where the process's earlier peak was higher) and the peak of Python's
allocations during it (tracemalloc, which slows the call), and what the call ended as. Memory only: no speed figure (the
machine is shared).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": '{"score": 0.5}'}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
}
_MIB = 1024 * 1024


def _bodies(max_tokens: int) -> dict[str, bytes]:
    """Bodies just under 16 MiB (the cap's floor), one of as many values as the judge parses,
    and the largest legitimate answer."""
    size = 16 * _MIB - 4096
    envelope = json.dumps({**_ANSWER, "pad": None}).encode()

    def padded(fill: bytes) -> bytes:
        n = (size - len(envelope)) // len(fill)
        return envelope.replace(b"null", b"[" + fill * n + b"0]")

    from scorers.judge._body import values_bound

    at_bound = values_bound(max_tokens) - 100  # each {} one value (the envelope, a few more)
    legit = "x" * (max_tokens * 64)  # the longest answer _too_long keeps
    return {
        "[{},{},...]": padded(b"{},"),
        f"[{{}},...] x {at_bound:,} (the bound)": envelope.replace(b"null", b"[" + b"{}," * at_bound + b"0]"),
        "[[],[],...]": padded(b"[],"),
        '[{"a":0},...]': padded(b'{"a":0},'),
        "[0.5,0.5,...]": padded(b"0.5,"),
        'string "x"*16MiB': envelope.replace(b"null", json.dumps("x" * (size - len(envelope))).encode()),
        'string "a, "*16MiB': envelope.replace(b"null", json.dumps("a, " * ((size - len(envelope)) // 3)).encode()),
        f"legit: {max_tokens * 64:,}-char answer": json.dumps(
            {**_ANSWER, "choices": [{"index": 0, "message": {"role": "assistant", "content": legit}}]}
        ).encode(),
    }


_CHILD = r"""
import json, resource, sys, tracemalloc
from scorers import Judge, ScorerRunError
from tests.fakellm import FakeLLMServer, Reply
from tests.judge.helpers import score_scorer
import os
body = open(sys.argv[1], "rb").read()
max_tokens = int(sys.argv[2])
with FakeLLMServer() as server:
    os.environ.update(OPENAI_BASE_URL=server.openai_base_url, OPENAI_API_KEY="sk-bench")
    server.record_bodies(False)
    scorer = score_scorer(Judge("openai/gpt-4o-mini", timeout=60, max_tokens=max_tokens))
    server.script(Reply.json({"score": 0.5}))
    scorer.run_sync(input="q", output="a")
    server.script(Reply.raw(body))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    tracemalloc.start()
    try:
        outcome = f"score {scorer.run_sync(input='q', output='a').score}"
    except ScorerRunError as exc:
        outcome = f"{type(exc.cause).__name__}: {str(exc.cause)[:110]}"
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"grew_mb": (after - before) / 1024, "traced_mb": traced / 1e6, "outcome": outcome}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-tokens", type=int, default=1024)
    args = parser.parse_args()
    import tempfile

    for name, body in _bodies(args.max_tokens).items():
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            f.write(body)
            f.flush()
            done = subprocess.run(
                [sys.executable, "-c", _CHILD, f.name, str(args.max_tokens)],
                capture_output=True,
                text=True,
                check=False,
            )
        if done.returncode:
            print(f"{name}: failed: {done.stderr[-400:]}")
            continue
        got = json.loads(done.stdout.strip().splitlines()[-1])
        sizes = (
            f"{len(body) / _MIB:6.1f} MiB body  peak RSS +{got['grew_mb']:4.0f} MB, traced {got['traced_mb']:4.0f} MB"
        )
        print(f"{name:32} {sizes}  {got['outcome']}")


if __name__ == "__main__":
    main()
