"""What objects of ours do in a process forked from the one that built them (tracing._fork)."""

from __future__ import annotations

import os

from tracing._fork import after_fork_in_child


class _Resets:
    def __init__(self, fd: int, mark: bytes, fail: bool = False) -> None:
        self.fd, self.mark, self.fail = fd, mark, fail
        after_fork_in_child(self.after_fork)

    def after_fork(self) -> None:
        if self.fail:
            raise RuntimeError("can't start new thread")
        os.write(self.fd, self.mark)


def test_one_failing_reset_does_not_keep_the_others_from_theirs() -> None:
    """One hook serves every registered object: an exporter whose reset raised (no thread could
    start) kept the publishers after it from forgetting the parent's connection and lock."""
    read_end, write_end = os.pipe()
    objects = [_Resets(write_end, b"a"), _Resets(write_end, b"", fail=True), _Resets(write_end, b"b")]
    pid = os.fork()
    if pid == 0:
        os._exit(0)  # the resets ran at the fork, in this child
    os.waitpid(pid, 0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        assert pipe.read() == b"ab"
    assert len(objects) == 3  # alive (held weakly by the registry) until here
