"""`GET /admin/config`: the running config as JSON with no secret in it (provider keys, the admin
key, the metrics token, credentials in `extra_headers`, passwords in URLs), where each secret
comes from (its variable, and whether it is set), the config file, and the reload status."""

from __future__ import annotations

from pathlib import Path

import httpx

from svir.config.load import parse_config
from svir.server import build_app
from tests.console.support import ADMIN, ADMIN_KEY, app

LAB_KEY = "sk-lab-config-secret-0123456789"
METRICS = "metrics-token-0123456789abcdef"
HEADER_TOKEN = "hdr-token-0123456789abcdef"
REDIS_PASSWORD = "redis-password-0123456789"
ENV = {"SVIR_ADMIN_KEY": ADMIN_KEY, "LAB_KEY": LAB_KEY, "SVIR_METRICS_TOKEN": METRICS}

CONFIG = f"""
[[providers]]
name = "lab"
kind = "openai-compatible"
base_url = "http://lab.test/v1"
api_key_env = "LAB_KEY"
models = ["tok-3"]
discover = false
[providers.extra_headers]
"X-Title" = "svir console"
"X-Org-Auth" = "org-credential-0123456789"
"X-Session-Token" = "{HEADER_TOKEN}"
"X-Mirror" = "{LAB_KEY}"

[[providers]]
name = "cloud"
kind = "openai"
api_key_env = "CLOUD_KEY_NOT_SET"
models = ["gpt-4o-mini"]
discover = false

[limits]
redis_url = "redis://:{REDIS_PASSWORD}@127.0.0.1:6379/0"

[[prices]]
model = "lab/"
input = 1.0
output = 2.0
"""
SECRETS = (LAB_KEY, METRICS, ADMIN_KEY, HEADER_TOKEN, REDIS_PASSWORD, "org-credential-0123456789")


async def test_config_shows_everything_but_secrets(tmp_path: Path) -> None:
    async with app(tmp_path, config=CONFIG, environ=ENV) as svir:
        r = await svir.http.get("/admin/config", headers=ADMIN)
        assert r.status_code == 200, r.text
        for secret in SECRETS:
            assert secret not in r.text, secret
        body = r.json()
        assert body["source"] is None
        assert body["reload"]["source"] is None and body["reload"]["generation"] == 0
        config = body["config"]
        lab = config["providers"][0]
        assert lab["name"] == "lab" and lab["api_key_env"] == "LAB_KEY"
        assert lab["extra_headers"] == {
            "X-Title": "svir console",
            "X-Org-Auth": "[redacted]",
            "X-Session-Token": "[redacted]",
            "X-Mirror": "[redacted]",  # a value equal to a key svir read
        }
        assert config["limits"]["redis_url"] == "redis://:[redacted]@127.0.0.1:6379/0"
        assert config["prices"] == [
            {"model": "lab/", "input": 1.0, "output": 2.0, "cached_input": None}
        ]
        assert config["auth"]["admin_key_env"] == "SVIR_ADMIN_KEY"
        assert config["server"]["port"] == 11434
        assert body["secrets"] == [
            {"where": "providers[0].api_key_env", "provider": "lab", "env": "LAB_KEY", "set": True},
            {
                "where": "providers[1].api_key_env",
                "provider": "cloud",
                "env": "CLOUD_KEY_NOT_SET",
                "set": False,
            },
            {"where": "auth.admin_key_env", "env": "SVIR_ADMIN_KEY", "set": True},
            {"where": "auth.metrics_token_env", "env": "SVIR_METRICS_TOKEN", "set": True},
        ]


async def test_config_names_the_file_it_came_from(tmp_path: Path) -> None:
    path = tmp_path / "svir.toml"
    path.write_text(CONFIG)
    built = build_app(parse_config(CONFIG), {"SVIR_ADMIN_KEY": ADMIN_KEY}, source=str(path))
    transport = httpx.ASGITransport(app=built)
    async with httpx.AsyncClient(transport=transport, base_url="http://svir") as http:
        r = await http.get("/admin/config", headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json()["source"] == str(path)
        # Unset here: the metrics token is said to be unset, the key too.
        assert {s["env"]: s["set"] for s in r.json()["secrets"]}["SVIR_METRICS_TOKEN"] is False


async def test_config_says_what_the_reloader_says_without_secrets(tmp_path: Path) -> None:
    async with app(tmp_path, config=CONFIG, environ=ENV) as svir:
        said = {"reloads": 2, "error": f"providers[0]: bad header {LAB_KEY}", "ok": False}
        svir.app.reload_status = lambda: said  # type: ignore[attr-defined]
        r = await svir.http.get("/admin/config", headers=ADMIN)
        assert r.status_code == 200 and LAB_KEY not in r.text
        assert r.json()["reload"] == {
            "reloads": 2,
            "error": "providers[0]: bad header [redacted]",
            "ok": False,
        }
