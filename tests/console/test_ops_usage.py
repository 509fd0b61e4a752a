"""What the console's usage and keys pages read: `/admin/keys?usage=1` (each key's limits with
what is used now, for budget bars) and `/admin/usage` by key, model and day, from any `since`."""

from __future__ import annotations

import datetime
import time
from pathlib import Path

from tests.console.support import ADMIN, ADMIN_KEY, app, assert_error

ENV = {"SVIR_ADMIN_KEY": ADMIN_KEY}


async def test_keys_with_their_usage_and_usage_by_day(tmp_path: Path) -> None:
    before = datetime.datetime.now(datetime.UTC).date()
    async with app(tmp_path, environ=ENV) as svir:
        made = []
        for name in ("busy", "idle"):
            r = await svir.http.post(
                "/admin/keys",
                json={"name": name, "rpm": 10, "tokens_per_day": 10_000},
                headers=ADMIN,
            )
            assert r.status_code == 201, r.text
            made.append(r.json())
        busy = svir.openai(made[0]["key"])
        for _ in range(2):
            await busy.chat.completions.create(
                model="lab/tok-3", messages=[{"role": "user", "content": "hi"}]
            )
        r = await svir.http.get("/admin/keys", headers=ADMIN)
        assert all("usage" not in k for k in r.json()["data"])
        r = await svir.http.get("/admin/keys?usage=1", headers=ADMIN)
        assert r.status_code == 200, r.text
        usage = {k["name"]: k["usage"] for k in r.json()["data"]}
        assert made[0]["key"] not in r.text and made[1]["key"] not in r.text
        assert usage["busy"]["rpm"] == {"limit": 10, "used": 2, "remaining": 8}
        used = usage["busy"]["tokens_per_day"]["used"]
        assert used > 0 and usage["busy"]["tokens_per_day"]["remaining"] == 10_000 - used
        assert usage["idle"]["rpm"]["used"] == 0 and usage["idle"]["tokens_per_day"]["used"] == 0

        today = datetime.datetime.now(datetime.UTC).date()
        days = {before.isoformat(), today.isoformat()}  # a test may cross midnight
        for since in ("7d", "24h", before.isoformat(), str(int(time.time()) - 3600)):
            r = await svir.http.get(f"/admin/usage?by=model,day&since={since}", headers=ADMIN)
            assert r.status_code == 200, (since, r.text)
            rows = r.json()["data"]
            assert {row["day"] for row in rows} <= days and {row["model"] for row in rows} == {
                "lab/tok-3"
            }
            assert sum(row["requests"] for row in rows) == 2
        # From tomorrow on: nothing yet.
        tomorrow = (today + datetime.timedelta(days=1)).isoformat()
        r = await svir.http.get(f"/admin/usage?by=day&since={tomorrow}", headers=ADMIN)
        assert r.json()["data"] == []
        r = await svir.http.get("/admin/usage?by=day&since=last-week", headers=ADMIN)
        assert assert_error(r, 400, None)["param"] == "since"
        r = await svir.http.get("/admin/usage?by=week", headers=ADMIN)
        assert assert_error(r, 400, None)["param"] == "by"
