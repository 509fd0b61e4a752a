"""The command line as a new user meets it (issue 19): `svir chat` saying svir's own error text,
the thread id of a piped thread chat, a stopped answer ending its line; `svir probe` on a port
nobody answers; `svir keys` saying which store it used, a store per config file, and a cost
budget without prices refused."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from svir.client.chat import ChatOptions, run_piped
from svir.client.history import LocalHistory
from svir.config.load import parse_config
from svir.store import default_url, with_store_url
from svir.wire.events import TextDelta
from tests.cli.conftest import run_svir, svir_env
from tests.support.svir_proc import SvirProcess, free_port
from tests.support.upstream import ScriptedServer


def keys_env(tmp: Path) -> dict[str, str]:
    env = svir_env(XDG_DATA_HOME=str(tmp / "data"))
    env.pop("SVIR_CONFIG", None)
    return env


@pytest.mark.external
def test_chat_shows_svirs_own_words_for_a_refused_key(
    replay: ScriptedServer, tmp_path: Path
) -> None:
    config = f"""
[[providers]]
name = "rp"
kind = "openai-compatible"
base_url = "{replay.base_url}"
"""
    svir = SvirProcess(config, tmp_path)
    assert svir.config_path is not None
    made = run_svir("keys", "create", "--name", "ci", "--config", str(svir.config_path),
                    env=keys_env(tmp_path))  # fmt: skip
    assert made.returncode == 0, made.stderr
    with svir:
        out = run_svir("chat", "rp/ok", "--base-url", svir.url, input="hi")
    assert out.returncode == 1
    assert "HTTP 401: HTTP 401" not in out.stderr
    assert re.search(r"HTTP 401: \S.*key", out.stderr), out.stderr


def test_piped_thread_chat_prints_the_thread_id(svir_replay: SvirProcess) -> None:
    out = run_svir("chat", "rp/llama-cpp", "--base-url", svir_replay.url, "--history", "thread",
                   input="hi")  # fmt: skip
    assert out.returncode == 0, out.stderr
    match = re.search(r"svir chat: thread (\S+) \(go on with --thread \1\)", out.stderr)
    assert match is not None, out.stderr
    # The thread is svir's and goes on.
    again = run_svir("chat", "rp/llama-cpp", "--base-url", svir_replay.url, "--thread",
                     match[1], input="and again")  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert f"thread {match[1]}" in again.stderr


class _Stopped(LocalHistory):
    """A history whose answer gives one piece and then is stopped (Ctrl-C)."""

    def __init__(self) -> None:
        pass

    def add(self, messages: object, model: str) -> None:
        pass

    def answer(self, *args: object) -> Iterator[object]:  # type: ignore[override]
        yield TextDelta("half an ans")
        raise KeyboardInterrupt


def test_a_stopped_piped_answer_ends_its_line() -> None:
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        run_piped(_Stopped(), ChatOptions(model="m"), "hi", out=out, err=err)
    assert out.getvalue() == "half an ans\n"


@pytest.mark.external
def test_probe_on_a_dead_port_does_not_suggest_a_model() -> None:
    out = run_svir("probe", f"http://127.0.0.1:{free_port()}", timeout=60)
    assert out.returncode != 0
    assert "cannot connect to http://127.0.0.1:" in out.stderr
    assert "--model" not in out.stderr


@pytest.mark.external
def test_a_cost_budget_without_prices_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "svir.toml"
    config.write_text("")
    out = run_svir("keys", "create", "--name", "x", "--cost-budget", "5/day", "--config",
                   str(config), env=keys_env(tmp_path))  # fmt: skip
    assert out.returncode == 2
    assert "--cost-budget needs prices" in out.stderr
    assert "[[prices]]" in out.stderr
    assert "--budget TOKENS/PERIOD" in out.stderr
    assert "sk-svir-" not in out.stdout  # no key was made
    listed = run_svir("keys", "list", "--config", str(config), env=keys_env(tmp_path))
    assert "No keys" in listed.stdout


@pytest.mark.external
def test_each_config_has_its_own_store_and_keys_say_which(tmp_path: Path) -> None:
    one, two = tmp_path / "one.toml", tmp_path / "two.toml"
    one.write_text("")
    two.write_text("")
    env = keys_env(tmp_path)
    made = run_svir("keys", "create", "--name", "a", "--config", str(one), env=env)
    assert made.returncode == 0, made.stderr
    store_one = default_url({"XDG_DATA_HOME": str(tmp_path / "data")}, one).removeprefix(
        "sqlite:///"
    )
    assert f"Store: {store_one} (SQLite)" in made.stdout
    # The other config and svir without a config see no key.
    other = run_svir("keys", "list", "--config", str(two), env=env)
    assert "No keys" in other.stdout and "configs/two-" in other.stdout
    bare = run_svir("keys", "list", env=env)
    assert "No keys" in bare.stdout
    assert f"Store: {tmp_path}/data/svir/svir.db (SQLite)" in bare.stdout
    listed = run_svir("keys", "list", "--config", str(one), env=env)
    assert " a " in listed.stdout and f"Store: {store_one}" in listed.stdout


def test_the_store_place_follows_the_config(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "HOME": "/home/u"}
    shared = tmp_path / "data" / "svir" / "svir.db"
    assert default_url(env) == f"sqlite:///{shared}"
    a = tmp_path / "a" / "svir.toml"
    b = tmp_path / "b" / "svir.toml"
    assert default_url(env, a) != default_url(env, b)  # same name, other file
    assert default_url(env, a).startswith(f"sqlite:///{tmp_path}/data/svir/configs/svir-")
    # A config map's file: the link it is read through is swapped on each update (`..data` ->
    # a new folder); the store stays the one of the path svir was given.
    mounted = tmp_path / "mnt" / "svir.toml"
    for version in ("v1", "v2"):
        (tmp_path / "mnt" / version).mkdir(parents=True)
        (tmp_path / "mnt" / version / "svir.toml").write_text("")
    mounted.parent.joinpath("..data").symlink_to("v1")
    mounted.symlink_to("..data/svir.toml")
    before = default_url(env, mounted)
    mounted.parent.joinpath("..data").unlink()
    mounted.parent.joinpath("..data").symlink_to("v2")
    assert default_url(env, mounted) == before
    assert default_url(env, tmp_path / "mnt" / "." / "svir.toml") == before
    # An explicit url stays as it was.
    explicit = parse_config('[store]\nurl = "sqlite:////srv/svir.db"\n')
    assert with_store_url(explicit, a, env) == (explicit, None)
    # No config: the shared store, as before.
    config, warning = with_store_url(parse_config(""), None, env)
    assert (config.store.url, warning) == (f"sqlite:///{shared}", None)
    # A config file whose new store is not there yet while the shared one is: said, not moved.
    shared.parent.mkdir(parents=True)
    shared.write_bytes(b"old data")
    config, warning = with_store_url(parse_config(""), a, env)
    assert config.store.url == default_url(env, a)
    assert warning is not None
    assert f'set [store] url = "sqlite:///{shared}" in {a}' in warning
    assert shared.read_bytes() == b"old data"
