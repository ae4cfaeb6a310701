"""The backfill's own Redis clients bound every exchange themselves.

redis-py before 8.0 (kombu allows 6.4) has no socket timeout: a backfill meeting a Redis that
stopped answering (paused, a partition) waited for good, past its Job's grace period on SIGTERM.
redis-py 8 gives up after 5 s by default, so a hung server cannot tell the two apart here: what is
checked is that the clients carry their own bound, whatever the installed redis-py's default."""

from __future__ import annotations

from worker._reconnect import COMMAND_SLACK_S
from worker.backfill._job import _settings
from worker.backfill._state import store_client
from worker.backfill._submit import RedisSubmitter


def _bounds(client: object) -> tuple[object, object]:
    kwargs = client.connection_pool.connection_kwargs  # type: ignore[attr-defined]
    return kwargs.get("socket_timeout"), kwargs.get("socket_connect_timeout")


def test_the_backfills_redis_clients_bound_every_exchange() -> None:
    settings = _settings("redis://:pw@127.0.0.1:1/0")
    assert _bounds(store_client(settings)) == (COMMAND_SLACK_S, 5.0)
    submitter = RedisSubmitter(settings)
    try:
        assert _bounds(submitter.store) == (COMMAND_SLACK_S, 5.0)
        assert _bounds(submitter._broker) == (COMMAND_SLACK_S, 5.0)
    finally:
        submitter.close()
