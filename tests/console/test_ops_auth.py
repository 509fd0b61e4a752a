"""The admin rule of every `/admin/` route (`admin_access`), each branch: the admin key set
(needed, from anywhere), unset with no keys (this machine only), unset once keys exist (off),
svir starting; and the admin key as a caller of the API (the console's playground) with the
openai SDK: no limits, and no key in the ledger."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from svir.asgi import exchange
from svir.edges.keys_service import admin_access
from svir.errors import GatewayError
from tests.console.support import ADMIN, ADMIN_KEY, CONFIG, ELSEWHERE, app, assert_error, client

WITH_ADMIN = {"SVIR_ADMIN_KEY": ADMIN_KEY}


async def test_with_an_admin_key_set_it_is_needed_and_enough_from_anywhere(
    tmp_path: Path,
) -> None:
    async with app(tmp_path, environ=WITH_ADMIN) as svir:
        r = await svir.http.get("/admin/console/session")
        assert_error(r, 401, "invalid_admin_key")
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert "SVIR_ADMIN_KEY" in r.json()["error"]["message"]
        wrong = {"Authorization": "Bearer not-the-admin-key-0123"}
        assert_error(await svir.http.get("/admin/models", headers=wrong), 401, "invalid_admin_key")
        # A bearer token only: Anthropic's header is a key's, not the admin's.
        r = await svir.http.get("/admin/config", headers={"x-api-key": ADMIN_KEY})
        assert_error(r, 401, "invalid_admin_key")
        # Every path under /admin/ is guarded, one no route has too.
        assert_error(await svir.http.get("/admin/no-such-thing"), 401, "invalid_admin_key")
        assert (await svir.http.get("/admin/no-such-thing", headers=ADMIN)).status_code == 404
        r = await svir.http.get("/admin/console/session", headers=ADMIN)
        assert r.status_code == 200, r.text
        assert r.json()["auth"] == "admin_key"
        async with client(svir, ELSEWHERE) as remote:
            assert_error(await remote.get("/admin/console/session"), 401, "invalid_admin_key")
            r = await remote.get("/admin/console/session", headers=ADMIN)
            assert r.status_code == 200 and r.json()["auth"] == "admin_key"


async def test_without_an_admin_key_and_no_keys_this_machine_only(tmp_path: Path) -> None:
    async with app(tmp_path) as svir:
        r = await svir.http.get("/admin/console/session")
        assert r.status_code == 200, r.text
        session = r.json()
        assert session["auth"] == "loopback" and session["keys_on"] is False
        assert session["workers"] == 1 and session["capture"] is False
        assert isinstance(session["pid"], int) and session["version"]
        async with client(svir, ELSEWHERE) as remote:
            r = await remote.get("/admin/console/session")
            error = assert_error(r, 403, "loopback_only")
            assert "SVIR_ADMIN_KEY" in error["message"]
            # A token changes nothing while no admin key is set.
            r = await remote.get("/admin/models", headers=ADMIN)
            assert_error(r, 403, "loopback_only")


async def test_opening_the_api_beyond_this_machine_does_not_open_the_admin_api(
    tmp_path: Path,
) -> None:
    config = CONFIG + "[auth]\nallow_open_non_loopback = true\n"
    async with app(tmp_path, config=config) as svir, client(svir, ELSEWHERE) as remote:
        r = await remote.post(
            "/v1/chat/completions",
            json={"model": "lab/tok-3", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert r.status_code == 200, r.text
        assert_error(await remote.get("/admin/console/session"), 403, "loopback_only")


async def test_without_an_admin_key_the_admin_api_is_off_once_a_key_exists(
    tmp_path: Path,
) -> None:
    async with app(tmp_path) as svir:
        # With no keys, this machine may issue the first one...
        r = await svir.http.post("/admin/keys", json={"name": "first"})
        assert r.status_code == 201, r.text
        # ... and from then on, without an admin key, nobody uses the admin API.
        for path in ("/admin/keys", "/admin/console/session", "/admin/models", "/admin/config"):
            error = assert_error(await svir.http.get(path), 403, "admin_disabled")
            assert "SVIR_ADMIN_KEY" in error["message"]


async def test_while_starting_without_an_admin_key_the_answer_is_wait(tmp_path: Path) -> None:
    async with app(tmp_path, start=False) as svir:
        assert_error(await svir.http.get("/admin/console/session"), 503, "starting")
    async with app(tmp_path, environ=WITH_ADMIN, start=False) as svir:
        r = await svir.http.get("/admin/console/session", headers=ADMIN)
        assert r.status_code == 200 and r.json()["keys_on"] is False


def test_admin_access_gives_the_verdict_the_guard_left() -> None:
    scope = {"path": "/admin/models"}
    exchange(scope).admin_access = "loopback"
    assert admin_access(scope) == "loopback"
    # No verdict (a route outside /admin/, or an app without svir.keys): refused.
    with pytest.raises(GatewayError) as caught:
        admin_access({"path": "/v1/models"})
    assert caught.value.error.status == 403


async def test_session_says_keys_are_on(tmp_path: Path) -> None:
    async with app(tmp_path, environ=WITH_ADMIN) as svir:
        r = await svir.http.post("/admin/keys", json={"name": "k"}, headers=ADMIN)
        assert r.status_code == 201
        r = await svir.http.get("/admin/console/session", headers=ADMIN)
        assert r.json()["keys_on"] is True


# ---------------------------------------------------------------------------------------------
# The admin key on the API (the playground)


async def test_the_admin_key_calls_the_api_without_limits_and_without_a_key_id(
    tmp_path: Path,
) -> None:
    async with app(tmp_path, environ=WITH_ADMIN) as svir:
        r = await svir.http.post("/admin/keys", json={"name": "tight", "rpm": 1}, headers=ADMIN)
        assert r.status_code == 201, r.text
        secret = r.json()["key"]
        keyed = svir.openai(secret)
        await keyed.chat.completions.create(
            model="lab/tok-3", messages=[{"role": "user", "content": "hi"}]
        )
        with pytest.raises(openai.RateLimitError):
            await keyed.chat.completions.create(
                model="lab/tok-3", messages=[{"role": "user", "content": "hi"}]
            )
        admin = svir.openai(ADMIN_KEY)
        for _ in range(3):
            answer = await admin.chat.completions.create(
                model="lab/tok-3", messages=[{"role": "user", "content": "hi"}]
            )
            assert answer.choices[0].message.content == "w0 w1 w2 "
        stream = await admin.chat.completions.create(
            model="smart", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        listed = await admin.models.list()
        assert "lab/found-later" in [m.id for m in listed.data]
        with pytest.raises(openai.AuthenticationError):
            await svir.openai("sk-svir-not-issued").models.list()
        # The ledger: the key's rows under its id, the admin's under none.
        r = await svir.http.get("/admin/usage?by=key&since=7d", headers=ADMIN)
        assert r.status_code == 200, r.text
        rows = {row["key"]: row for row in r.json()["data"]}
        assert rows[None]["requests"] == 4 and rows[None]["completion_tokens"] > 0
        key_id = next(k for k in rows if k is not None)
        assert key_id.startswith("key_") and rows[key_id]["requests"] == 2
        assert rows[key_id]["errors"] == 1


async def test_the_admin_key_passes_where_open_svir_serves_this_machine_only(
    tmp_path: Path,
) -> None:
    body = {"model": "lab/tok-3", "messages": [{"role": "user", "content": "hi"}]}
    async with app(tmp_path, environ=WITH_ADMIN) as svir, client(svir, ELSEWHERE) as remote:
        assert_error(await remote.post("/v1/chat/completions", json=body), 403, "loopback_only")
        wrong = {"Authorization": "Bearer not-the-admin-key-0123"}
        r = await remote.post("/v1/chat/completions", json=body, headers=wrong)
        assert_error(r, 403, "loopback_only")
        r = await remote.post("/v1/chat/completions", json=body, headers=ADMIN)
        assert r.status_code == 200, r.text
        # Anthropic's clients send it as x-api-key.
        r = await remote.post(
            "/v1/messages",
            json={
                "model": "lab/tok-3",
                "max_tokens": 16,
                "messages": [{"role": "user", "content": "hi"}],
            },
            headers={"x-api-key": ADMIN_KEY, "anthropic-version": "2023-06-01"},
        )
        assert r.status_code == 200, r.text
