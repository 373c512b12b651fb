"""One contract, two transports: redis-py over TCP and upstash-redis over REST, real Redis."""

from __future__ import annotations

import json

import pytest
import redis as redis_py
from upstash_redis import Redis as UpstashRedis

from sluice.core.errors import ConfigurationError, PermanentStoreError, TransientStoreError
from sluice.core.settings import Settings
from sluice.store.redis_clients import RedisClient, RedisPyClient, UpstashClient, connect
from tests.conftest import free_port
from tests.providers.upstash import UpstashRestServer

pytestmark = [pytest.mark.redis]

AWKWARD = ['{"id":"a","n":1}', "not json at all", "ünïcödé ✓ 𝄞", "", "OK", "line\nbreak\t\"q\""]


def test_list_commands_round_trip_exact_strings(redis_client: RedisClient) -> None:
    assert redis_client.ping() is True
    assert redis_client.rpush("l", *AWKWARD) == len(AWKWARD)
    assert redis_client.lpush("l", "first") == len(AWKWARD) + 1
    assert redis_client.lrange("l", 0, -1) == ["first", *AWKWARD]
    assert redis_client.llen("l") == len(AWKWARD) + 1
    assert redis_client.lrem("l", 1, "not json at all") == 1
    assert redis_client.lmove("l", "m") == AWKWARD[-1]  # RIGHT -> LEFT by default
    assert redis_client.lmove("empty", "m") is None
    assert redis_client.lrange("m", 0, -1) == [AWKWARD[-1]]
    assert redis_client.delete("l", "m", "never") == 2
    assert redis_client.llen("l") == 0
    assert redis_client.delete() == 0


def test_keys_carry_the_prefix(redis_client: RedisClient, redis_server: str,
                               redis_prefix: str) -> None:
    redis_client.rpush("ai:ledger:retry:queue", "x")
    raw = redis_py.Redis.from_url(redis_server, decode_responses=True)
    assert raw.lrange(redis_prefix + "ai:ledger:retry:queue", 0, -1) == ["x"]
    assert redis_client.key("k") == redis_prefix + "k"
    raw.close()


def test_eval_returns_ints_strings_and_nested_lists(redis_client: RedisClient) -> None:
    redis_client.rpush("q", "a", "b", "ünï")
    script = "return {redis.call('LLEN', KEYS[1]), ARGV[1], redis.call('LRANGE', KEYS[1], 0, -1)}"
    assert redis_client.eval(script, ["q"], [7]) == [3, "7", ["a", "b", "ünï"]]
    assert redis_client.eval("return redis.call('LPOP', KEYS[1])", ["nothing"], []) is None


def test_a_script_error_is_a_permanent_store_error(redis_client: RedisClient) -> None:
    with pytest.raises(PermanentStoreError):
        redis_client.eval("return redis.call('NOPE')", [], [])


def test_an_unreachable_redis_is_transient(transport: str) -> None:
    port = free_port()
    if transport == "redis-py":
        client: RedisClient = connect(Settings(redis_url=f"redis://127.0.0.1:{port}/0"))
    else:
        client = UpstashClient.from_url(f"http://127.0.0.1:{port}", "token", retries=0)
    with pytest.raises(TransientStoreError):
        client.llen("q")
    client.close()  # type: ignore[attr-defined]


def test_a_wrong_upstash_token_is_permanent(upstash_server: UpstashRestServer) -> None:
    client = UpstashClient.from_url(upstash_server.url, "wrong-token", retries=0)
    with pytest.raises(PermanentStoreError, match="Unauthorized"):
        client.llen("q")
    client.close()


def test_an_upstash_gateway_page_is_transient(upstash_server: UpstashRestServer,
                                              redis_prefix: str) -> None:
    client = UpstashClient.from_url(upstash_server.url, upstash_server.token, redis_prefix,
                                    retries=0)
    upstash_server.fail_next.append(502)
    with pytest.raises(TransientStoreError):
        client.llen("q")
    assert client.llen("q") == 0
    client.close()


def test_the_stand_in_speaks_pipeline_multi_exec_and_path_style(
        upstash_server: UpstashRestServer, redis_prefix: str) -> None:
    """The REST protocol features upstash-redis relies on, through the library itself."""
    for encoding in ("base64", None):
        client = UpstashRedis(upstash_server.url, upstash_server.token, rest_encoding=encoding,
                              allow_telemetry=False)
        key = f"{redis_prefix}p:{encoding}"
        pipe = client.pipeline()
        pipe.rpush(key, "a", "b")
        pipe.lrange(key, 0, -1)
        pipe.set(f"{key}:s", "v")
        assert pipe.exec() == [2, ["a", "b"], True]
        tx = client.multi()
        tx.lmove(key, f"{key}:2", "LEFT", "RIGHT")
        tx.llen(key)
        assert tx.exec() == ["a", 1]
        client.close()
    import httpx

    auth = {"Authorization": f"Bearer {upstash_server.token}"}
    answer = httpx.post(f"{upstash_server.url}/llen/{redis_prefix}p:base64", headers=auth)
    assert answer.json() == {"result": 1}
    bad = httpx.post(upstash_server.url, headers=auth, json=["LPUSH"])
    assert bad.status_code == 400 and "wrong number of arguments" in bad.json()["error"]
    pipe_errors = httpx.post(f"{upstash_server.url}/pipeline", headers=auth,
                             json=[["SET", f"{redis_prefix}s", "1"], ["LPUSH", f"{redis_prefix}s", "x"]])
    assert pipe_errors.json()[0] == {"result": "OK"}
    assert "WRONGTYPE" in pipe_errors.json()[1]["error"]
    token_param = httpx.post(f"{upstash_server.url}?_token={upstash_server.token}",
                             json=["PING"])
    assert token_param.json() == {"result": "PONG"}
    encoded = httpx.post(upstash_server.url, headers={**auth, "Upstash-Encoding": "base64"},
                         json=["ECHO", "hi"])
    assert encoded.json() == {"result": "aGk="}
    assert httpx.post(upstash_server.url, json=["PING"]).status_code == 401


def test_connect_picks_the_transport_from_settings(redis_env: dict[str, str],
                                                   transport: str) -> None:
    client = connect(Settings.from_env(redis_env))
    assert isinstance(client, RedisPyClient if transport == "redis-py" else UpstashClient)
    client.close()
    with pytest.raises(ConfigurationError, match="no Redis configured"):
        connect(Settings())


def test_json_values_are_not_reinterpreted(redis_client: RedisClient) -> None:
    value = json.dumps({"id": "x", "entry": {"n": [1, 2]}, "s": "ü"})
    redis_client.lpush("j", value)
    assert redis_client.lrange("j", 0, 0) == [value]
