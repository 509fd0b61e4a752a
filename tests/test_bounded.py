"""svir.policy.bounded: the map that holds state per model name within a bound, and the router's
`known` that says which names are held whatever the bound."""

from __future__ import annotations

import pytest

from svir.config.load import parse_config
from svir.edges.upstream import UpstreamClient
from svir.policy.bounded import BoundedMap
from svir.policy.resilience import Resilience, Timing
from svir.policy.routing import Router
from tests.support.mock_server import MockServer
from tests.support.upstream import ScriptedUpstream


def test_the_least_recently_used_other_goes_first() -> None:
    m: BoundedMap[str, int] = BoundedMap(3)
    for i, key in enumerate("abc"):
        m[key] = i
    assert m.get("a") == 0  # a is now the most recently used: b is the oldest
    m["d"] = 3
    assert [k for k, _ in m.items()] == ["c", "a", "d"]
    m["c"] = 9  # a write counts as a use too
    m["e"] = 4
    assert [k for k, _ in m.items()] == ["d", "c", "e"]
    assert len(m) == 3 and "a" not in m and m.get("a") is None


def test_kept_keys_are_never_evicted_and_do_not_count() -> None:
    m: BoundedMap[str, int] = BoundedMap(2, keep=lambda k: k.startswith("cfg/"))
    m["cfg/a"] = 1
    m["cfg/b"] = 2
    for i in range(50):
        m[f"x/{i}"] = i
    assert dict(m.items()) == {"cfg/a": 1, "cfg/b": 2, "x/48": 48, "x/49": 49}


def test_an_idle_entry_goes_before_a_busy_one_and_the_bound_still_holds() -> None:
    busy = {"a", "b"}
    m: BoundedMap[str, str] = BoundedMap(3, idle=lambda v: v not in busy)
    for key in "abc":
        m[key] = key
    m["d"] = "d"  # a and b are older, but busy: c goes
    assert [k for k, _ in m.items()] == ["a", "b", "d"]
    busy.add("d")
    m["e"] = "e"  # everything busy: the least recently used goes anyway
    assert [k for k, _ in m.items()] == ["b", "d", "e"]


def test_a_key_listed_later_is_held_from_its_next_use() -> None:
    listed: set[str] = set()
    m: BoundedMap[str, int] = BoundedMap(1, keep=listed.__contains__)
    m["late"] = 1
    listed.add("late")
    assert m.get("late") == 1
    m["x"] = 2
    m["y"] = 3
    assert dict(m.items()) == {"late": 1, "y": 3}


def test_setdefault_makes_once_and_cap_zero_holds_kept_keys_only() -> None:
    made: list[str] = []

    def make(key: str) -> list[str]:
        made.append(key)
        return [key]

    m: BoundedMap[str, list[str]] = BoundedMap(5)
    first = m.setdefault("a", lambda: make("a"))
    assert m.setdefault("a", lambda: make("a")) is first and made == ["a"]
    del m["a"]
    assert "a" not in m

    zero: BoundedMap[str, int] = BoundedMap(0, keep=lambda k: k == "cfg")
    assert zero.setdefault("x", lambda: 7) == 7
    zero["cfg"] = 1
    assert dict(zero.items()) == {"cfg": 1}
    with pytest.raises(ValueError, match="cap"):
        BoundedMap(-1)


async def test_known_models_are_the_configured_and_the_listed() -> None:
    async with MockServer(ScriptedUpstream(models=["found", "also-found"])) as server:
        config = parse_config(
            f"""
[server]
max_unlisted_models = 7

[[providers]]
name = "lab"
kind = "openai-compatible"
base_url = "{server.base_url}"
models = ["gemma"]
discover = true

[[routes]]
name = "smart"
targets = [{{ model = "lab/big" }}]
fallbacks = ["lab/small"]
context_fallback = "lab/long"
"""
        )
        router = Router(config, {}, UpstreamClient())
        try:
            for name in ("lab/gemma", "smart", "lab/big", "lab/small", "lab/long"):
                assert router.known(name), name
            assert not router.known("lab/found")  # not listed yet: nobody asked
            assert ("lab/found", "lab") in await router.models()
            assert router.known("lab/found") and router.known("lab/also-found")
            assert not router.known("lab/invented")
            assert not router.known("nope/gemma")
            m: BoundedMap[str, int] = router.bounded()
            assert m.cap == 7 and m.keep("lab/found") and not m.keep("lab/invented")
        finally:
            await router.client.close()


def test_a_resting_deployment_outlives_a_flood_of_invented_ones() -> None:
    config = parse_config(
        """
[server]
max_unlisted_models = 3

[[providers]]
name = "lab"
kind = "openai-compatible"
base_url = "http://127.0.0.1:9/v1"
models = ["gemma"]
discover = false
"""
    )
    router = Router(config, {}, UpstreamClient())
    res = Resilience(config, router, router.client, timing=Timing(clock=lambda: 100.0))
    res.deployment("lab/gemma").in_flight = 2
    flaky = res.deployment("lab/unlisted-but-real")
    flaky.failures, flaky.open_until = 5, 130.0
    busy = res.deployment("lab/busy")
    busy.in_flight = 1
    for i in range(50):
        res.deployment(f"lab/invented-{i}")
    snap = res.snapshot()["deployments"]
    assert set(snap) == {"lab/gemma", "lab/unlisted-but-real", "lab/busy", "lab/invented-49"}
    assert snap["lab/unlisted-but-real"]["state"] == "open"
    assert snap["lab/gemma"]["in_flight"] == 2 and snap["lab/busy"]["in_flight"] == 1
    assert res.deployment("lab/unlisted-but-real") is flaky
