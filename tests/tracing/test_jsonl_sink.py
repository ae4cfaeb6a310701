"""The JSONL sink across a write that fails part way (a full disk, a file size limit): what it
delivered before and after must stay readable lines, whoever appends next."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests._forked import in_forked_child
from tracing import ScoreRecord, score_id_for
from tracing.sinks import Delivered, JsonlSink, Retry

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _record(n: int, reason: str = "short") -> ScoreRecord:
    span = f"{n + 1:016x}"
    return ScoreRecord(
        score_id=score_id_for(TRACE, span, "s", "1"),
        trace_id=TRACE,
        span_id=span,
        scorer_id="s",
        score=0.5,
        reason=reason,
    )


def _lines(path: Path) -> tuple[list[str], int]:
    """The score ids of the lines that read as records, and how many lines do not."""
    ids, bad = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            ids.append(json.loads(line)["score_id"])
        except (ValueError, KeyError):
            bad += 1
    return ids, bad


def test_a_write_cut_short_leaves_the_next_delivered_line_whole(tmp_path: Path) -> None:
    """A process whose write stopped part way (here a file size limit: the disk full alike) and
    then ended left half a line; the next process's first record was appended to it, one
    unreadable line, though its drainer counted it delivered."""
    path = tmp_path / "scores.jsonl"
    first = JsonlSink(path)
    assert first.deliver([_record(0)]) == [Delivered()]
    first.close()

    def cut_short() -> dict[str, Any]:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 100, resource.RLIM_INFINITY))
        sink = JsonlSink(path)
        outcome = sink.deliver([_record(1, reason="x" * 5000)])
        with contextlib.suppress(OSError):  # (what a buffered sink still held is lost with the process)
            sink.close()
        return {"retry": [isinstance(o, Retry) for o in outcome]}

    report, code = in_forked_child(cut_short)
    assert (report, code) == ({"retry": [True]}, 0)
    assert path.stat().st_size > len(_record(0).model_dump_json()) + 1  # half a line is there

    after = JsonlSink(path)
    assert after.deliver([_record(1, reason="x" * 5000), _record(2)]) == [Delivered(), Delivered()]
    after.close()
    ids, bad = _lines(path)
    assert ids == [_record(n).score_id for n in range(3)]
    assert bad == 1  # the half line, left as a line of its own


def test_a_file_the_process_may_only_write_is_appended_to() -> None:
    """The sink opens its file to read its last byte as well: a file the worker's user may write
    but not read (a log file shared with a collector) failed to open at all. It is appended to
    without that look."""
    if os.geteuid() != 0:
        pytest.skip("needs root, to run the sink as another user")
    with tempfile.TemporaryDirectory() as where:  # (pytest's own is not open to another user)
        os.chmod(where, 0o755)
        path = Path(where, "scores.jsonl")
        path.write_text("")
        path.chmod(0o622)  # (the owner, root, may read it; any other user only write)

        def as_another_user() -> dict[str, Any]:
            os.setgid(65534)
            os.setuid(65534)  # (nobody)
            sink = JsonlSink(path)
            outcome = sink.deliver([_record(0), _record(1)])
            sink.close()
            return {"delivered": [isinstance(o, Delivered) for o in outcome]}

        assert in_forked_child(as_another_user) == ({"delivered": [True, True]}, 0)
        assert _lines(path) == ([_record(0).score_id, _record(1).score_id], 0)
