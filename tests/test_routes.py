"""The one router (svir.protocols.router) and the app's answers for what it does not route: a path
template's parameters, the template as the route's label, 404 and 405 (with `Allow`) in the error
shape of the prefix a path is under."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from svir.asgi import Receive, Scope, Send, exchange
from svir.config.load import parse_config
from svir.edges.app import App
from svir.errors import GatewayError
from svir.protocols.http import send_json
from svir.protocols.router import Route, Routes


async def echo(scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]) -> int:
    body = {"route": exchange(scope).route, "params": scope.get("path_params")}
    await send_json(send, 200, body, {"x-request-id": rid})
    return 200


def plain(exc: GatewayError) -> dict[str, str]:
    return {"error": exc.error.message}


def scope_of(method: str, path: str) -> Scope:
    return {"type": "http", "method": method, "path": path, "headers": []}


def test_an_exact_path_is_one_lookup_and_a_template_keeps_its_parameters() -> None:
    routes = Routes()
    routes.add("GET", "/v1/things", echo)
    routes.add("GET", "/v1/things/{thing_id}/parts/{part_id}", echo)
    scope = scope_of("GET", "/v1/things")
    assert routes.match(scope).template == "/v1/things"
    assert "path_params" not in scope
    scope = scope_of("GET", "/v1/things/t1/parts/p2")
    assert routes.match(scope).template == "/v1/things/{thing_id}/parts/{part_id}"
    assert scope["path_params"] == {"thing_id": "t1", "part_id": "p2"}
    # A parameter is one whole segment: not empty, never two.
    for path in ("/v1/things//parts/p2", "/v1/things/t1/x/parts/p2", "/v1/things/t1/parts/p2/"):
        assert routes.match(scope_of("GET", path)).template is None, path
    # A template is not a path: a client sending one gets a parameter named by its braces.
    scope = scope_of("GET", "/v1/things/{thing_id}/parts/{part_id}")
    assert routes.match(scope).template == "/v1/things/{thing_id}/parts/{part_id}"
    assert scope["path_params"] == {"thing_id": "{thing_id}", "part_id": "{part_id}"}


def test_a_route_is_added_once() -> None:
    routes = Routes()
    routes.add("GET", "/x/{a}", echo)
    with pytest.raises(ValueError, match=re.escape("GET /x/{a}")):
        routes.add("GET", "/x/{a}", echo)


@pytest.fixture
def app() -> App:
    app = App(parse_config(""), {})
    app.routes.add("GET", "/v1/things", echo)
    app.routes.add("POST", "/v1/things", echo)
    app.routes.add("GET", "/v1/things/{thing_id}", echo)
    app.routes.add("DELETE", "/v1/things/{thing_id}", echo)
    app.routes.add("GET", "/plain/version", echo, plain)
    app.routes.errors_under("/plain/", plain)
    return app


async def request(app: App, method: str, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svir") as client:
        return await client.request(method, path)


async def test_the_label_is_the_template_and_the_handler_gets_the_parameters(app: App) -> None:
    r = await request(app, "GET", "/v1/things/t-1")
    assert r.json() == {"route": "/v1/things/{thing_id}", "params": {"thing_id": "t-1"}}
    r = await request(app, "POST", "/v1/things")
    assert r.json() == {"route": "/v1/things", "params": None}


async def test_a_method_the_routes_do_not_take_is_a_405_naming_those_they_take(app: App) -> None:
    r = await request(app, "PUT", "/v1/things/t-1")
    assert r.status_code == 405 and r.headers["allow"] == "DELETE, GET"
    assert r.json()["error"]["code"] == "method_not_allowed"
    assert (
        r.json()["error"]["message"] == "PUT is not allowed on /v1/things/t-1: it takes DELETE, GET"
    )
    r = await request(app, "DELETE", "/v1/things")
    assert r.status_code == 405 and r.headers["allow"] == "GET, POST"
    r = await request(app, "POST", "/plain/version")
    assert r.status_code == 405 and r.json() == {
        "error": "POST is not allowed on /plain/version: it takes GET"
    }


async def test_a_path_no_route_has_is_a_404_in_the_shape_of_its_prefix(app: App) -> None:
    r = await request(app, "GET", "/v1/nothing")
    assert r.status_code == 404 and r.headers["x-request-id"]
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "not_found"
    assert error["message"] == "svir does not serve GET /v1/nothing"
    r = await request(app, "GET", "/plain/nothing")
    assert r.status_code == 404 and r.json() == {"error": "svir does not serve GET /plain/nothing"}


async def test_the_capture_composed_in_serves_its_routes_whenever_they_were_added(app: App) -> None:
    # Capture is a part of the app's pipeline (App.compose), not a wrapper put on the handlers
    # installed so far: a route added after it is captured as one added before, and what it
    # does not capture (a GET, a 405, a 404) goes straight to its handler.
    served: list[tuple[str, str]] = []

    class Tap:
        def captures(self, route: Route) -> bool:
            return route.method == "POST"

        async def serve(
            self, handler: Any, scope: Scope, receive: Receive, send: Send, **rest: Any
        ) -> int:
            served.append((scope["method"], scope["path"]))
            status: int = await handler(scope, receive, send, rest["rid"], rest["fields"])
            return status

    app.compose([], Tap())  # type: ignore[arg-type]
    app.routes.add("POST", "/v1/later", echo)
    for method, path, status in [
        ("POST", "/v1/things", 200),
        ("POST", "/v1/later", 200),
        ("GET", "/v1/things", 200),
        ("PUT", "/v1/things", 405),
        ("POST", "/v1/nothing", 404),
    ]:
        assert (await request(app, method, path)).status_code == status
    assert served == [("POST", "/v1/things"), ("POST", "/v1/later")]
