"""A Redis that evicts keys when full (any maxmemory-policy but noeviction, with a maxmemory)
would drop score records (what keeps a redelivery from scoring again), claims, queued runs and
job states without a word: a backfill waited for ever at 600 of 2,400 scores while `status`
showed all well (queue-fault audit). Workers and backfills refuse it, and `status` says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests._redis import RedisServer
from tests.backfill._synth import write_otlp_files
from tests.worker._workers import failed_start
from worker.cli import cli

SAID = "evicts keys when full (maxmemory-policy allkeys-lru)"


@pytest.fixture
def evicting(private_redis: RedisServer) -> RedisServer:
    client = private_redis.client(0)
    client.config_set("maxmemory", 256 * 2**20)
    client.config_set("maxmemory-policy", "allkeys-lru")
    client.close()
    return private_redis


def test_a_worker_refuses_to_start_on_it(evicting: RedisServer) -> None:
    done = failed_start(evicting.url(0))
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"the broker at redis://:***@127.0.0.1:{evicting.port}/0 {SAID}" in done.stderr
    assert evicting.password not in done.stdout + done.stderr


def test_a_backfill_refuses_it_before_enqueuing(evicting: RedisServer, tmp_path: Path) -> None:
    write_otlp_files(tmp_path, 10, files=1)
    result = CliRunner().invoke(
        cli, ["backfill", str(tmp_path), "--scorers", "tests.backfill.scorers", "--broker", evicting.url(0)]
    )
    assert result.exit_code == 1, result.output
    assert SAID in result.stderr
    assert evicting.client(0).dbsize() == 0  # nothing enqueued, no job state


def test_status_names_the_policy(evicting: RedisServer) -> None:
    runner = CliRunner()
    as_json = runner.invoke(cli, ["status", "--json", "--timeout", "0.3", "--broker", evicting.url(0)])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)["broker_evicts"] == "allkeys-lru"
    text = runner.invoke(cli, ["status", "--timeout", "0.3", "--broker", evicting.url(0)])
    assert "broker EVICTS  maxmemory-policy allkeys-lru" in text.stdout


def test_a_maxmemory_without_eviction_or_no_maxmemory_is_fine(evicting: RedisServer) -> None:
    client = evicting.client(0)
    client.config_set("maxmemory-policy", "noeviction")
    said = CliRunner().invoke(cli, ["status", "--json", "--timeout", "0.3", "--broker", evicting.url(0)])
    assert json.loads(said.stdout)["broker_evicts"] is None
    client.config_set("maxmemory-policy", "volatile-lru")
    client.config_set("maxmemory", 0)  # no limit: nothing is ever evicted
    said = CliRunner().invoke(cli, ["status", "--json", "--timeout", "0.3", "--broker", evicting.url(0)])
    assert json.loads(said.stdout)["broker_evicts"] is None
    client.close()


def test_status_names_a_separate_score_store_that_evicts(private_redis: RedisServer) -> None:
    """TRACESCORE_REDIS_URL names a Redis of its own that evicts while the broker does not:
    `status` checked the broker only and showed all well (the workers refuse such a store)."""
    with RedisServer() as store:
        client = store.client(0)
        client.config_set("maxmemory", 256 * 2**20)
        client.config_set("maxmemory-policy", "volatile-lru")
        client.close()
        runner = CliRunner(env={"TRACESCORE_REDIS_URL": store.url(0)})
        args = ["status", "--timeout", "0.3", "--broker", private_redis.url(0)]
        as_json = runner.invoke(cli, [*args, "--json"])
        assert as_json.exit_code == 0, as_json.output
        said = json.loads(as_json.stdout)
        assert (said["broker_evicts"], said["store_evicts"]) == (None, "volatile-lru")
        assert said["store"] == f"redis://:***@127.0.0.1:{store.port}/0"
        text = runner.invoke(cli, args)
        assert f"score store redis://:***@127.0.0.1:{store.port}/0 EVICTS  maxmemory-policy volatile-lru" in (
            text.stdout
        )
        assert "broker EVICTS" not in text.stdout
        assert store.password not in text.stdout + as_json.stdout


def test_status_on_one_redis_names_its_policy_once(evicting: RedisServer) -> None:
    said = CliRunner().invoke(cli, ["status", "--timeout", "0.3", "--broker", evicting.url(0)])
    assert said.stdout.count("EVICTS") == 1, said.stdout
    as_json = CliRunner().invoke(cli, ["status", "--json", "--timeout", "0.3", "--broker", evicting.url(0)])
    assert json.loads(as_json.stdout)["store_evicts"] == "allkeys-lru"
