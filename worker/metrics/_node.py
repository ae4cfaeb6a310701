"""One metrics endpoint per worker node, in its parent process, over all of its processes.

Under the prefork pool every child records into files of its own in the node's
``PROMETHEUS_MULTIPROC_DIR`` (``prometheus_client``'s multiprocess mode); the parent's
``/metrics`` adds them up, with the scrape-time Redis gauges (``_collector.py``). The directory
is the node's own (``<base>/<node name>``, base ``TRACESCORE_METRICS_DIR`` or the temp dir)
and is emptied when the node starts: two nodes on one host never mix their files, and a
restart does not count the previous run again. A child that exits has its live gauges removed
(``mark_process_dead``): by itself when it shuts down, or by the parent's next scrape when it
was killed. Its counters stay: what it did still happened.
"""

from __future__ import annotations

import glob
import importlib
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from celery import bootsteps, signals

from worker._process import alive
from worker.metrics import _instruments
from worker.metrics._collector import RedisStateCollector
from worker.metrics._otlp import OtlpMetricsPusher, otlp_metrics_endpoint

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import CollectorRegistry

    from worker._settings import Settings

__all__ = ["MetricsStep", "NodeMetrics", "start_node_metrics", "stop_node_metrics"]

log = structlog.get_logger("tracescore.worker.metrics")

_DEFAULT_EXPORT_INTERVAL_MS = 60_000.0
_LIVE_FILE = re.compile(r"gauge_live\w+?_(\d+)\.db$")


@dataclass
class NodeMetrics:
    """A running node's metrics: its registry, HTTP server (port 0: none) and OTLP pusher."""

    node: str
    directory: Path
    registry: CollectorRegistry
    collector: RedisStateCollector
    server: Any | None
    port: int | None
    pusher: OtlpMetricsPusher | None
    pid: int

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
        if self.pusher is not None:
            self.pusher.stop()
        self.collector.close()


class _ProcessFiles:
    """The multiprocess files, summed; first drops the live gauges of children that are gone."""

    def __init__(self, directory: Path) -> None:
        self._directory = directory
        self._files = _client("multiprocess").MultiProcessCollector(None, path=str(directory))

    def collect(self) -> Iterator[Metric]:
        sweep_dead_processes(self._directory)
        return iter(self._files.collect())


def _client(module: str) -> Any:
    # The client's multiprocess helpers are untyped; imported on use (see _instruments.py).
    return importlib.import_module(f"prometheus_client.{module}")


def sweep_dead_processes(directory: Path) -> list[int]:
    """``mark_process_dead`` for every process with live-gauge files that no longer runs."""
    multiprocess = _client("multiprocess")
    dead = []
    for path in glob.glob(str(directory / "gauge_live*_*.db")):
        found = _LIVE_FILE.search(path)
        if found is None:
            continue
        pid = int(found.group(1))
        if not alive(pid):
            multiprocess.mark_process_dead(pid, str(directory))
            dead.append(pid)
    return dead


def _node_directory(base_dir: str | None, node: str) -> Path:
    base = base_dir or os.path.join(tempfile.gettempdir(), "tracescore-metrics")
    directory = Path(base) / re.sub(r"[^A-Za-z0-9_.@-]", "_", node)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink(missing_ok=True)
    return directory


def _use_multiprocess_values(directory: Path) -> None:
    # The client picks its value store when imported, from this variable: set it for this
    # process and every child forked from it (it is the client's switch, not a setting of ours).
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    values = _client("values")
    if getattr(values.ValueClass, "__name__", "") != "MmapedValue":
        # Imported earlier, before the directory was known: switch it now (our metric objects
        # are built again below; nothing else in the worker records into the client).
        values.ValueClass = values.MultiProcessValue()
    _instruments.reset()


_node: NodeMetrics | None = None
_lock = threading.Lock()


def start_node_metrics(settings: Settings, node: str, *, scores_here: bool = True) -> NodeMetrics | None:
    """Start this node's metrics when ``settings`` ask for them (a port, or OTLP with an
    endpoint set); None when they are off. ``scores_here``: this process runs tasks itself
    (threads/solo pool) rather than through forked children (prefork)."""
    global _node
    otlp = settings.otlp_metrics and otlp_metrics_endpoint() is not None
    if not settings.metrics_port and not otlp:
        return None
    from prometheus_client import CollectorRegistry, start_http_server

    with _lock:
        if _node is not None and _node.pid == os.getpid():
            return _node
        directory = _node_directory(settings.metrics_dir, node)
        _use_multiprocess_values(directory)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_ProcessFiles(directory))
        collector = RedisStateCollector(settings, node)
        registry.register(collector)
        pusher = None
        if otlp:  # (built first: headers it cannot send stop the start before a port is taken)
            pusher = OtlpMetricsPusher(
                registry,
                {"service.name": "tracescore-worker", "service.instance.id": node},
                _export_interval_ms() / 1000,
            )
        server = None
        if settings.metrics_port:
            server, _ = start_http_server(settings.metrics_port, addr=settings.metrics_host, registry=registry)
        if pusher is not None:
            pusher.start()
        _node = NodeMetrics(
            node, directory, registry, collector, server, settings.metrics_port or None, pusher, os.getpid()
        )
    if scores_here:
        _instruments.process_started()
    log.info(
        "worker_metrics_started",
        node=node,
        port=settings.metrics_port or None,
        otlp=bool(otlp),
        directory=str(directory),
    )
    return _node


def _export_interval_ms() -> float:
    raw = os.environ.get("OTEL_METRIC_EXPORT_INTERVAL", "")
    try:
        value = float(raw) if raw.strip() else _DEFAULT_EXPORT_INTERVAL_MS
    except ValueError:
        log.warning("bad_otel_metric_export_interval", value=raw[:40], default_ms=_DEFAULT_EXPORT_INTERVAL_MS)
        return _DEFAULT_EXPORT_INTERVAL_MS
    return value if value > 0 else _DEFAULT_EXPORT_INTERVAL_MS


def stop_node_metrics() -> None:
    """Stop the node's endpoint and push the last OTLP export (the worker is shutting down)."""
    global _node
    with _lock:
        node, _node = _node, None
    if node is None or node.pid != os.getpid():
        return
    try:
        node.close()
    except Exception:
        log.warning("worker_metrics_stop_failed", exc_info=True)


class MetricsStep(bootsteps.Step):
    """Starts the node's metrics in the worker's parent, before the pool forks its children."""

    def __init__(self, parent: Any, **options: Any) -> None:
        from worker._settings import SettingsError

        super().__init__(parent, **options)
        try:
            settings = parent.app.settings
        except SettingsError:
            return  # reported by the start-up checks (ScorersOption)
        pool = getattr(parent, "pool_cls", None)
        prefork = "prefork" in f"{getattr(pool, '__module__', '')}.{getattr(pool, '__name__', pool)}"
        try:
            start_node_metrics(settings, str(parent.hostname), scores_here=not prefork)
        except OSError as exc:
            raise SystemExit(
                f"tracescore worker cannot start: metrics on port {settings.metrics_port}: {exc.strerror or exc}"
            ) from None
        except ValueError as exc:  # the OTLP metrics exporter's headers
            raise SystemExit(f"tracescore worker cannot start: metrics: {exc}") from None


@signals.worker_process_init.connect
def _child_started(**_: Any) -> None:
    if _node is not None:  # inherited from the parent: this child's node has metrics on
        _instruments.process_started()


@signals.worker_process_shutdown.connect
def _child_stopped(**_: Any) -> None:
    if _node is not None and _node.pid != os.getpid():
        _client("multiprocess").mark_process_dead(os.getpid(), str(_node.directory))


@signals.worker_shutdown.connect
def _node_stopped(**_: Any) -> None:
    stop_node_metrics()
