"""The JSONL sink across a write that fails part way (a full disk, a file size limit): what it
delivered before and after must stay readable lines, whoever appends next."""

from __future__ import annotations

import contextlib
import json
import resource
import signal
from pathlib import Path
from typing import Any

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
