"""bench/backfill.py's probe of the workers' cyclic GC: on PYTHONPATH only for the workers it
starts (Python imports ``sitecustomize`` at start-up), it adds up each process's collections
(CPU seconds and count, by generation) and rewrites them to ``$TRACESCORE_BENCH_GC_DIR/<pid>``
after each one. A prefork child inherits the callback and writes its own file. Under the
worker's settings (worker/_gc.py) collections are rare, so writing a small file after each costs
nothing measurable; the many of start-up, under the interpreter's defaults, fall before the
bench's clock starts.
"""

from __future__ import annotations

import gc
import json
import os
import time
from typing import Any

_DIR = os.environ.get("TRACESCORE_BENCH_GC_DIR")

if _DIR:
    _totals: dict[str, Any] = {"pid": 0, "cpu_s": [0.0, 0.0, 0.0], "collections": [0, 0, 0]}
    _started = [0.0]

    def _on_collection(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            _started[0] = time.process_time()
            return
        pid = os.getpid()
        if _totals["pid"] != pid:  # a forked child: its own totals from here on
            _totals.update(pid=pid, cpu_s=[0.0, 0.0, 0.0], collections=[0, 0, 0])
        generation = info["generation"]
        _totals["cpu_s"][generation] += time.process_time() - _started[0]
        _totals["collections"][generation] += 1
        path = os.path.join(_DIR, str(pid))
        with open(path + ".tmp", "w") as f:
            json.dump(_totals, f)
        os.replace(path + ".tmp", path)

    gc.callbacks.append(_on_collection)
