"""What a config reload sees changed between two configs (svir.config_diff): routes and
providers added, removed or changed, which servers are another server now (their learned state
starts afresh), which managed models restart, and which fields apply only after a restart."""

from __future__ import annotations

from pathlib import Path

from svir.config.load import parse_config
from svir.config.model import Config
from svir.config_diff import diff_configs, effective


def lab(base_url: str = "http://10.0.0.1:8080", extra: str = "") -> str:
    return f"""
[[providers]]
name = "lab"
kind = "llamacpp"
base_url = "{base_url}"
{extra}
"""


CLOUD = """
[[providers]]
name = "cloud"
kind = "openai"
api_key_env = "OPENAI_API_KEY"
"""

ROUTE = """
[[routes]]
name = "smart"
targets = [{{ model = "lab/gemma", weight = {weight} }}, {{ model = "cloud/gpt-4o-mini", weight = 1 }}]
"""


def config(text: str) -> Config:
    return parse_config(text, source="svir.toml")


def test_the_same_config_changes_nothing() -> None:
    text = lab() + CLOUD + ROUTE.format(weight=2)
    diff = diff_configs(config(text), config(text))
    assert diff.changed == () and diff.restart_needed == ()
    assert diff.fresh_deployments() == set()


def test_a_route_added_removed_and_reweighted() -> None:
    old = config(lab() + CLOUD + ROUTE.format(weight=2))
    reweighted = diff_configs(old, config(lab() + CLOUD + ROUTE.format(weight=5)))
    assert reweighted.changed == ("routes.smart.targets: changed",)
    assert reweighted.fresh_deployments() == set()  # the same servers: their state carries on
    removed = diff_configs(old, config(lab() + CLOUD))
    assert removed.changed == ("routes.smart: removed",)
    added = diff_configs(config(lab() + CLOUD), old)
    assert added.changed == ("routes.smart: added",)
    assert added.providers_changed == frozenset() and added.restart_needed == ()


def test_a_provider_added_removed_and_moved_to_another_server() -> None:
    old = config(lab() + CLOUD)
    added = diff_configs(config(lab()), old)
    assert (added.changed, added.providers_added) == (("providers.cloud: added",), {"cloud"})
    removed = diff_configs(old, config(lab()))
    assert removed.changed == ("providers.cloud: removed",)
    assert removed.providers_removed == {"cloud"}
    assert removed.fresh_deployments() == {"cloud/"}
    moved = diff_configs(old, config(lab("http://10.0.0.2:8080") + CLOUD))
    assert moved.changed == ("providers.lab.base_url: changed",)
    assert (moved.providers_changed, moved.servers_changed) == ({"lab"}, {"lab"})
    assert moved.fresh_deployments() == {"lab/"}


def test_a_provider_setting_that_keeps_the_server_keeps_its_state() -> None:
    old = config(lab() + CLOUD)
    new = config(lab(extra="[providers.timeouts]\nfirst_byte = 20\n[providers.breaker]\n"
                     "failures = 2") + CLOUD)  # fmt: skip
    diff = diff_configs(old, new)
    assert diff.changed == (
        "providers.lab.timeouts.first_byte: changed",
        "providers.lab.breaker.failures: changed",
    )
    assert diff.providers_changed == {"lab"}
    assert diff.servers_changed == frozenset() and diff.fresh_deployments() == set()


def managed(models: str, settings: str = "") -> str:
    return (
        '[[providers]]\nname = "local"\nkind = "llamacpp-managed"\n'
        f"[providers.managed]\nctx = 2048\n{settings}\n[providers.managed.models]\n{models}\n"
    )


def test_a_managed_model_restarts_only_when_its_own_settings_change(tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"GGUF")
    b.write_bytes(b"GGUF")
    two = f'a = "{a}"\nb = "{b}"'
    old = config(managed(two))
    ctx = diff_configs(old, config(managed(f'a = {{ path = "{a}", ctx = 4096 }}\nb = "{b}"')))
    assert ctx.managed_restart == {"local": {"a"}}
    assert ctx.changed == (
        "providers.local.managed.models.a: ctx changed (its server restarts once its requests end)",
    )
    assert ctx.fresh_deployments() == {"local/a"}  # b's state carries on
    assert ctx.servers_changed == frozenset()
    # A provider-wide setting that every model takes restarts every model.
    threads = diff_configs(old, config(managed(two, "threads = 4")))
    assert threads.managed_restart == {"local": {"a", "b"}}
    # Settings of the supervisor, not of a server: nothing restarts.
    idle = diff_configs(old, config(managed(two, "idle_unload = 30\nmax_loaded = 2")))
    assert idle.managed_restart == {} and idle.fresh_deployments() == set()
    assert idle.changed == (
        "providers.local.managed.idle_unload: changed",
        "providers.local.managed.max_loaded: changed",
    )
    fewer = diff_configs(old, config(managed(f'a = "{a}"')))
    assert fewer.managed_removed == {"local": {"b"}} and fewer.managed_restart == {}
    assert fewer.fresh_deployments() == {"local/b"}


def test_fields_read_once_at_start_are_kept_and_reported() -> None:
    old = config(lab())
    new = config(
        lab()
        + '[server]\nport = 9999\nmodels_cache_ttl = 5\n[limits]\nbackend = "redis"\n'
        + '[store]\nurl = "sqlite:////tmp/other.db"\n'
    )
    diff = diff_configs(old, new)
    assert diff.restart_needed == ("server.port", "store.url", "limits.backend")
    assert diff.changed == ("server.models_cache_ttl: changed",)
    served = effective(old, new)
    assert served.server.port == old.server.port  # still where it listens
    assert served.limits.backend == "memory" and served.store.url == old.store.url
    assert served.server.models_cache_ttl == 5  # taken at once
    assert served.providers == new.providers
