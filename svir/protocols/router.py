"""The one router: a route is a method and a path template (`/v1/threads/{thread_id}`) served by a
handler, with the shape its errors are answered in; and `Host`, what a front end installs its
routes on (svir.edges.app.App).

Matching costs one dict lookup for a path without parameters (every chat request); only a path
that is not one of those is tried against the templates, which keep their parameters in
`scope["path_params"]`. A path no route has is a 404, one whose routes take other methods a 405
naming them in `Allow`, each in the error shape of the prefix it is under (`errors_under`; OpenAI's
otherwise). Two protocols may share a path when one of them is told apart by a request header
(`GET /v1/models` is OpenAI's list, and Anthropic's when `anthropic-version` is sent): the second
adds its route with `when_header`, and only a path that has such a route pays for the look. A
route's template is the label it is counted and traced under (the app notes it as the request's
`svir.asgi.Exchange.route`): a bounded set, whatever paths clients send.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Protocol

from svir.asgi import Receive, Scope, Send
from svir.config.model import Config
from svir.errors import GatewayError, request_error
from svir.policy.catalog import Catalog
from svir.policy.gateway import Gateway
from svir.policy.routing import Router
from svir.wire.classify import error_body

__all__ = ["ErrorShape", "Handler", "Hook", "Host", "Route", "Routes", "Tap", "openai_error"]

# Serves one request: gets the request id and the log fields to fill, returns the status it
# answered with, and raises what the app's error mapper answers (svir.edges.app).
Handler = Callable[[Scope, Receive, Send, str, dict[str, Any]], Awaitable[int]]
# The body of an error answer in a front end's own shape.
ErrorShape = Callable[[GatewayError], Any]
Hook = Callable[[], Awaitable[None]]

_PARAM: Final = re.compile(r"\{([a-z_]+)\}")


def openai_error(exc: GatewayError) -> dict[str, Any]:
    """OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`: the default."""
    return error_body(exc.error)


class Route:
    """What serves a request: `template` (None for a path no route has, under no prefix) is its
    label in metrics and traces; `method` the method it was added for (None: the 404 or 405 of a
    request no route takes). `variants` are the routes that take the request instead when it
    carries their header (`Routes.add(..., when_header=...)`), in the order they were added."""

    __slots__ = ("errors", "handler", "method", "template", "variants", "when_header")

    def __init__(
        self,
        template: str | None,
        handler: Handler,
        errors: ErrorShape,
        method: str | None = None,
    ) -> None:
        self.template = template
        self.handler = handler
        self.errors = errors
        self.method = method
        self.variants: tuple[tuple[bytes, Route], ...] = ()
        self.when_header: bytes | None = None

    def pick(self, scope: Scope) -> Route:
        """This route, or the variant whose header the request carries."""
        for name, variant in self.variants:
            for key, _ in scope["headers"]:
                if key == name:
                    return variant
        return self


class Routes:
    def __init__(self) -> None:
        self._exact: dict[tuple[str, str], Route] = {}
        # Each template's routes by method; a template without parameters is also its path.
        self._by_template: dict[str, dict[str, Route]] = {}
        self._by_path: dict[str, dict[str, Route]] = {}
        self._templates: list[tuple[re.Pattern[str], dict[str, Route]]] = []
        self._prefixes: list[tuple[str, ErrorShape]] = []

    def add(
        self,
        method: str,
        template: str,
        handler: Handler,
        errors: ErrorShape = openai_error,
        *,
        when_header: bytes | None = None,
    ) -> None:
        """Serve `method template` with `handler`; its errors are answered as `errors` shapes
        them. `{name}` in `template` matches one path segment, kept as `path_params[name]`.
        With `when_header` (lower case), the route takes only the requests that carry that
        header, ahead of the plain route for `method template`, whichever was added first (alone,
        it takes every request)."""
        if when_header is not None and when_header != when_header.lower():
            raise ValueError(f"header names are matched in lower case: {when_header!r}")
        route = Route(template, handler, errors, method)
        methods = self._by_template.get(template)
        if methods is None:
            methods = self._by_template[template] = {}
            if "{" in template:
                self._templates.append((_pattern(template), methods))
            else:
                self._by_path[template] = methods
        existing = methods.get(method)
        if existing is not None and when_header is not None:
            existing.variants = (*existing.variants, (when_header, route))
            return
        if existing is not None:
            if existing.when_header is None:
                raise ValueError(f"{method} {template} has a route already")
            # The header route came first: it becomes a variant of this one.
            route.variants = ((existing.when_header, existing), *existing.variants)
            existing.variants = ()
        route.when_header = when_header
        methods[method] = route
        if "{" not in template:
            self._exact[(method, template)] = route

    def errors_under(self, prefix: str, errors: ErrorShape) -> None:
        """Answer the 404 or 405 of a path starting with `prefix` as `errors` shapes it."""
        self._prefixes.append((prefix, errors))

    def match(self, scope: Scope) -> Route:
        """The route of a request; for a path no route takes, one that raises its 404 or 405."""
        method: str = scope["method"]
        path: str = scope["path"]
        route = self._exact.get((method, path))
        if route is not None:
            return route.pick(scope) if route.variants else route
        methods = self._by_path.get(path)
        params: dict[str, str] | None = None
        if methods is None:
            for pattern, candidates in self._templates:
                found = pattern.fullmatch(path)
                if found is not None:
                    methods, params = candidates, found.groupdict()
                    break
            else:
                return self._not_found(path)
        route = methods.get(method)
        if route is None:
            return _not_allowed(methods)
        if params is not None:
            scope["path_params"] = params
        return route.pick(scope) if route.variants else route

    def _not_found(self, path: str) -> Route:
        for prefix, errors in self._prefixes:
            if path.startswith(prefix):
                return Route(prefix, _no_route, errors)
        return Route(None, _no_route, openai_error)


def _pattern(template: str) -> re.Pattern[str]:
    literals = _PARAM.split(template)
    # split() alternates literal text and parameter names: even items are text.
    parts = [
        re.escape(piece) if n % 2 == 0 else f"(?P<{piece}>[^/]+)"
        for n, piece in enumerate(literals)
    ]
    return re.compile("".join(parts))


async def _no_route(
    scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
) -> int:
    raise request_error(
        f"svir does not serve {scope['method']} {scope['path']}", status=404, code="not_found"
    )


def _not_allowed(methods: dict[str, Route]) -> Route:
    allowed = ", ".join(sorted(methods))
    some = next(iter(methods.values()))

    async def refuse(
        scope: Scope, receive: Receive, send: Send, rid: str, fields: dict[str, Any]
    ) -> int:
        raise request_error(
            f"{scope['method']} is not allowed on {scope['path']}: it takes {allowed}",
            status=405,
            code="method_not_allowed",
            headers={"Allow": allowed},
        )

    return Route(some.template, refuse, some.errors)


class Tap(Protocol):
    """What serves the requests of the routes it takes in their handlers' stead, running the
    handler itself (the console's capture, svir.console.capture.Capturer): the app asks it of
    every matched route."""

    def captures(self, route: Route) -> bool: ...

    async def serve(
        self,
        handler: Handler,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        rid: str,
        fields: dict[str, Any],
    ) -> int: ...


class Host(Protocol):
    """What a front end is installed on: the app's config, environment and gateway, its route
    table, its start-up, stopping and shut-down hooks, and the models a request may see listed."""

    config: Config
    environ: Mapping[str, str]
    gateway: Gateway
    routes: Routes
    catalog: Catalog

    @property
    def router(self) -> Router: ...

    def on_startup(self, hook: Hook) -> None: ...

    def on_shutdown(self, hook: Hook) -> None: ...

    def on_stopping(self, hook: Callable[[], None]) -> None: ...

    async def models(self, scope: Scope) -> list[tuple[str, str]]: ...
