"""svir's upstream client behind a corporate proxy, all on loopback: the whole app in process with
the real client (`UpstreamClient`), a forward proxy written for the tests and TLS upstreams with a
CA made here (tests/support/proxy.py) serving the scripted upstream.

https upstreams go through a CONNECT tunnel with TLS to the upstream inside it (checked against
the upstream's name), http ones as absolute-form requests; `no_proxy`, a provider's `proxy`,
`proxy = false`, `ca_file`, `SSL_CERT_FILE` and mTLS (`client_cert`, `client_key`); a proxy that
refuses or cannot be reached is named in the error, never its password."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from svir.edges.upstream import UpstreamClient
from svir.wire.proxy import ProxyURL, UnusableProxy
from tests.support.inprocess import InProcess
from tests.support.mock_server import MockServer
from tests.support.proxy import ForwardProxy, PrivateCA
from tests.support.upstream import ScriptedUpstream
from tests.test_resilience import provider as resilience_provider

CHAT = {"model": "lab/ok", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> PrivateCA:
    return PrivateCA(tmp_path_factory.mktemp("ca"))


def provider(base: str, extra: str = "", *, name: str = "lab", attempts: int = 1) -> str:
    """test_resilience's provider at `base`, tried `attempts` times."""
    return resilience_provider(name, base, f"{extra}\n[providers.retry]\nattempts = {attempts}")


@asynccontextmanager
async def svir(
    tmp: Path, config: str, environ: Mapping[str, str] | None = None
) -> AsyncIterator[InProcess]:
    """The app with the real upstream client, its config read from a file in `tmp` (relative
    paths start there)."""
    app = InProcess(
        tmp,
        config,
        ScriptedUpstream(),
        {"SVIR_ADMIN_KEY": "admin-secret", **(environ or {})},
        config_file=tmp / "svir.toml",
        upstream_client=UpstreamClient(environ={}),
    )
    await app.start()
    try:
        yield app
    finally:
        await app.stop()


@asynccontextmanager
async def tls_upstream(
    ca: PrivateCA, *, require_client_cert: bool = False, names: list[str] | None = None
) -> AsyncIterator[MockServer[ScriptedUpstream]]:
    """The scripted upstream over TLS with the CA's server certificate; `names` gets each SNI
    name a client sent."""
    context = ca.server_context(require_client_cert=require_client_cert)
    if names is not None:
        context.sni_callback = lambda _obj, name, _ctx: names.append(name)  # type: ignore[assignment,misc]
    async with MockServer(ScriptedUpstream(), ssl=context) as server:
        yield server


async def chat(app: InProcess, **extra: Any) -> httpx.Response:
    return await app.http.post("/v1/chat/completions", json={**CHAT, **extra})


def answer_text(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def error_message(r: httpx.Response) -> str:
    assert r.status_code == 502, r.text
    return str(r.json()["error"]["message"])


async def test_https_proxy_tunnels_to_an_https_upstream_by_its_name(
    tmp_path: Path, ca: PrivateCA
) -> None:
    names: list[str] = []
    async with tls_upstream(ca, names=names) as up, ForwardProxy() as proxy:
        # A name only the proxy resolves (to 127.0.0.1): svir must not look it up itself.
        base = f"https://upstream.test:{up.port}/v1"
        config = provider(base, f'ca_file = "{ca.ca}"')
        async with svir(tmp_path, config, {"HTTPS_PROXY": proxy.url}) as app:
            assert answer_text(await chat(app)) == "hello world"
            streamed = await chat(app, stream=True)
            assert streamed.status_code == 200
            assert '"hello' in streamed.text and streamed.text.endswith("data: [DONE]\n\n")
            assert answer_text(await chat(app)) == "hello world"
    # One tunnel, kept for the later requests; TLS named the upstream, not the proxy.
    assert proxy.connects == [f"upstream.test:{up.port}"]
    assert proxy.request_lines == [f"CONNECT upstream.test:{up.port} HTTP/1.1"]
    assert names == ["upstream.test"]
    assert len(up.chat_requests) == 3


async def test_the_certificate_is_checked_against_the_upstreams_name(
    tmp_path: Path, ca: PrivateCA
) -> None:
    async with tls_upstream(ca) as up, ForwardProxy() as proxy:
        # The proxy (127.0.0.1) is in the certificate; this upstream's name is not.
        config = provider(f"https://other.test:{up.port}/v1", f'ca_file = "{ca.ca}"')
        async with svir(tmp_path, config, {"HTTPS_PROXY": proxy.url}) as app:
            message = error_message(await chat(app))
    assert proxy.connects == [f"other.test:{up.port}"]
    assert "certificate is not trusted" in message and "other.test" in message, message
    assert not up.chat_requests


async def test_a_loopback_upstream_never_takes_the_environments_proxy(
    tmp_path: Path, ca: PrivateCA
) -> None:
    async with tls_upstream(ca) as up, ForwardProxy() as proxy:
        config = provider(f"https://localhost:{up.port}/v1", f'ca_file = "{ca.ca}"')
        env = {"HTTPS_PROXY": proxy.url, "ALL_PROXY": proxy.url}
        async with svir(tmp_path, config, env) as app:
            assert answer_text(await chat(app)) == "hello world"
    assert proxy.request_lines == []


async def test_a_providers_own_proxy_overrides_the_environments(
    tmp_path: Path, ca: PrivateCA
) -> None:
    async with (
        tls_upstream(ca) as up,
        ForwardProxy() as env_proxy,
        ForwardProxy() as own_proxy,
    ):
        # Its own proxy takes even a loopback upstream: the config asked for it.
        extra = f'ca_file = "{ca.ca}"\nproxy = "{own_proxy.url}"'
        config = provider(f"https://localhost:{up.port}/v1", extra)
        async with svir(tmp_path, config, {"https_proxy": env_proxy.url}) as app:
            assert answer_text(await chat(app)) == "hello world"
    assert own_proxy.connects == [f"localhost:{up.port}"]
    assert env_proxy.request_lines == []


@pytest.mark.parametrize(
    ("host", "no_proxy", "direct"),
    [
        ("localhost", "localhost", True),
        ("localhost", ".localhost", True),
        ("localhost", "example.com, LOCALHOST", True),
        ("localhost", "localhost:{port}", True),
        ("localhost", "localhost:1", False),
        ("localhost", "*", True),
        ("localhost", "calhost", False),
        ("127.0.0.1", "127.0.0.0/8", True),
        ("127.0.0.1", "10.0.0.0/8", False),
    ],
)
async def test_no_proxy_sends_matching_hosts_direct(
    tmp_path: Path, ca: PrivateCA, host: str, no_proxy: str, direct: bool
) -> None:
    async with tls_upstream(ca) as up, ForwardProxy() as proxy:
        extra = f'ca_file = "{ca.ca}"\nproxy = "{proxy.url}"'
        config = provider(f"https://{host}:{up.port}/v1", extra)
        env = {"NO_PROXY": no_proxy.format(port=up.port)}
        async with svir(tmp_path, config, env) as app:
            assert answer_text(await chat(app)) == "hello world"
    assert proxy.connects == ([] if direct else [f"{host}:{up.port}"])


async def test_an_http_upstream_goes_to_the_proxy_in_absolute_form(tmp_path: Path) -> None:
    async with (
        MockServer(ScriptedUpstream()) as up,
        ForwardProxy(credentials=("svc", "p@ss word")) as proxy,
    ):
        base = f"http://upstream.test:{up.port}/v1"
        env = {"HTTP_PROXY": f"http://svc:p%40ss%20word@127.0.0.1:{proxy.port}"}
        async with svir(tmp_path, provider(base), env) as app:
            assert answer_text(await chat(app)) == "hello world"
    assert proxy.connects == []
    assert proxy.request_lines == [
        f"POST http://upstream.test:{up.port}/v1/chat/completions HTTP/1.1"
    ]
    assert proxy.authorizations == ["Basic c3ZjOnBAc3Mgd29yZA=="]  # svc:p@ss word
    assert up.chat_requests[0].headers.get("host") == f"upstream.test:{up.port}"


async def test_proxy_credentials_open_the_tunnel(tmp_path: Path, ca: PrivateCA) -> None:
    async with tls_upstream(ca) as up, ForwardProxy(credentials=("svc", "hunter2!")) as proxy:
        config = provider(f"https://upstream.test:{up.port}/v1", f'ca_file = "{ca.ca}"')
        env = {"https_proxy": f"svc:hunter2!@127.0.0.1:{proxy.port}"}  # no scheme, as curl takes
        async with svir(tmp_path, config, env) as app:
            assert answer_text(await chat(app)) == "hello world"
    assert proxy.connects == [f"upstream.test:{up.port}"]


async def test_a_proxy_that_refuses_is_named_and_retried_as_a_connect_error(
    tmp_path: Path, ca: PrivateCA, caplog: pytest.LogCaptureFixture
) -> None:
    password = "pr0xy-passw0rd-xyz"
    async with ForwardProxy(credentials=("svc", "right")) as proxy:
        config = provider("https://upstream.test:443/v1", attempts=2)
        env = {"HTTPS_PROXY": f"http://svc:{password}@127.0.0.1:{proxy.port}"}
        with caplog.at_level(logging.INFO):
            async with svir(tmp_path, config, env) as app:
                message = error_message(await chat(app))
    assert f"proxy 127.0.0.1:{proxy.port} refused the tunnel to upstream.test:443" in message
    assert "407" in message and "provider 'lab'" in message, message
    assert password not in message
    assert password not in caplog.text
    # Retried as a connect failure is: both attempts asked the proxy.
    assert proxy.connects == [] and len(proxy.request_lines) == 2


async def test_a_proxy_that_cannot_be_reached_is_named(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    config = provider("https://upstream.test:443/v1")
    env = {"HTTPS_PROXY": f"http://svc:s3cret-value@127.0.0.1:{closed}"}
    async with svir(tmp_path, config, env) as app:
        message = error_message(await chat(app))
    assert f"cannot connect to the proxy 127.0.0.1:{closed}" in message, message
    assert "provider 'lab'" in message and "s3cret-value" not in message


async def test_an_unusable_proxy_variable_fails_rather_than_going_around_it(
    tmp_path: Path,
) -> None:
    config = provider("https://upstream.test:443/v1")
    async with svir(tmp_path, config, {"HTTPS_PROXY": "socks5://127.0.0.1:1080"}) as app:
        message = error_message(await chat(app))
    assert "HTTPS_PROXY" in message and "socks5" in message, message


async def test_ca_file_verifies_a_private_upstream(tmp_path: Path, ca: PrivateCA) -> None:
    async with tls_upstream(ca) as up:
        base = f"https://localhost:{up.port}/v1"
        # Relative to the config file, as the config's other paths are.
        (tmp_path / "certs").mkdir()
        (tmp_path / "certs" / "corp-ca.pem").write_bytes(ca.ca.read_bytes())
        async with svir(tmp_path, provider(base, 'ca_file = "certs/corp-ca.pem"')) as app:
            assert answer_text(await chat(app)) == "hello world"
        async with svir(tmp_path, provider(base)) as app:
            message = error_message(await chat(app))
    assert "certificate is not trusted" in message and "ca_file" in message, message
    assert len(up.chat_requests) == 1


async def test_ssl_cert_file_is_the_default_trust(
    tmp_path: Path, ca: PrivateCA, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(ca.ca))
    async with (
        tls_upstream(ca) as up,
        svir(tmp_path, provider(f"https://localhost:{up.port}/v1")) as app,
    ):
        assert answer_text(await chat(app)) == "hello world"


async def test_mtls_client_certificate(tmp_path: Path, ca: PrivateCA) -> None:
    async with tls_upstream(ca, require_client_cert=True) as up:
        base = f"https://localhost:{up.port}/v1"
        mtls = (
            f'ca_file = "{ca.ca}"\nclient_cert = "{ca.client_cert}"\nclient_key = "{ca.client_key}"'
        )
        async with svir(tmp_path, provider(base, mtls)) as app:
            assert answer_text(await chat(app)) == "hello world"
        async with svir(tmp_path, provider(base, f'ca_file = "{ca.ca}"')) as app:
            r = await chat(app)
    assert r.status_code == 502, r.text
    assert "certificate" in r.json()["error"]["message"].lower(), r.text
    assert len(up.chat_requests) == 1


async def test_a_tunnel_serves_only_its_own_upstream(tmp_path: Path, ca: PrivateCA) -> None:
    async with tls_upstream(ca) as one, tls_upstream(ca) as two, ForwardProxy() as proxy:
        config = provider(
            f"https://upstream.test:{one.port}/v1", f'ca_file = "{ca.ca}"', name="one"
        ) + provider(f"https://upstream.test:{two.port}/v1", f'ca_file = "{ca.ca}"', name="two")
        async with svir(tmp_path, config, {"HTTPS_PROXY": proxy.url}) as app:
            for _ in range(2):
                for name in ("one", "two"):
                    r = await chat(app, model=f"{name}/ok")
                    assert answer_text(r) == "hello world"
    assert sorted(proxy.connects) == sorted(
        [f"upstream.test:{one.port}", f"upstream.test:{two.port}"]
    )
    assert len(one.chat_requests) == 2 and len(two.chat_requests) == 2


async def test_a_reload_changes_the_proxy(tmp_path: Path, ca: PrivateCA) -> None:
    async with tls_upstream(ca) as up, ForwardProxy() as first, ForwardProxy() as second:
        base = f"https://localhost:{up.port}/v1"
        with_proxy = provider(base, f'ca_file = "{ca.ca}"\nproxy = "{first.url}"')
        async with svir(tmp_path, with_proxy) as app:
            assert answer_text(await chat(app)) == "hello world"
            store = f'\n[store]\nurl = "sqlite:///{tmp_path / "svir.db"}"\n'
            (tmp_path / "svir.toml").write_text(
                provider(base, f'ca_file = "{ca.ca}"\nproxy = "{second.url}"') + store
            )
            r = await app.http.post(
                "/admin/reload", headers={"Authorization": "Bearer admin-secret"}
            )
            assert r.status_code == 200 and "providers.lab.proxy" in json.dumps(r.json()), r.text
            assert answer_text(await chat(app)) == "hello world"
            (tmp_path / "svir.toml").write_text(provider(base, "proxy = false") + store)
            r = await app.http.post(
                "/admin/reload", headers={"Authorization": "Bearer admin-secret"}
            )
            assert r.status_code == 200, r.text
            # No ca_file now: the default trust refuses the private CA, directly.
            assert "certificate is not trusted" in error_message(await chat(app))
    assert first.connects == [f"localhost:{up.port}"]
    assert second.connects == [f"localhost:{up.port}"]


async def test_streaming_through_the_tunnel_arrives_as_it_is_sent(
    tmp_path: Path, ca: PrivateCA
) -> None:
    async with tls_upstream(ca) as up, ForwardProxy() as proxy:
        config = provider(f"https://upstream.test:{up.port}/v1", f'ca_file = "{ca.ca}"')
        async with svir(tmp_path, config, {"HTTPS_PROXY": proxy.url}) as app:
            body = {**CHAT, "model": "lab/tok-5", "stream": True}
            async with app.http.stream("POST", "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                text = "".join([part async for part in r.aiter_text()])
    words = [
        json.loads(line[6:])["choices"][0]["delta"].get("content")
        for line in text.splitlines()
        if line.startswith("data: {") and json.loads(line[6:])["choices"]
    ]
    assert "".join(w for w in words if w) == "w0 w1 w2 w3 w4 "
    assert proxy.connects == [f"upstream.test:{up.port}"]


async def test_each_provider_sends_with_its_own_network(tmp_path: Path) -> None:
    """Which proxy each provider's requests get, as the transport is handed it: the
    environment's, none (`proxy = false`), its own, or `proxy_env`'s (an unset one fails
    rather than going direct)."""
    base = "https://api.corp/v1"
    config = (
        provider(base, name="env")
        + provider(base, "proxy = false", name="off")
        + provider(base, 'proxy = "http://own.corp:8080"', name="own")
        + provider(base, 'proxy_env = "CORP_PROXY"', name="byenv")
        + provider(base, 'proxy_env = "UNSET_PROXY"', name="unset")
    )
    env = {"HTTPS_PROXY": "http://env.corp:3128", "CORP_PROXY": "http://u:pw12345@vault:9"}
    upstream = ScriptedUpstream()
    app = InProcess(tmp_path, config, upstream, env)
    await app.start()
    try:
        for name in ("env", "off", "own", "byenv", "unset"):
            assert answer_text(await chat(app, model=f"{name}/ok")) == "hello world"
    finally:
        await app.stop()
    chosen = []
    for request in app.transport.requests:
        assert request.network is not None
        chosen.append(request.network.proxies.proxy_for("https", "api.corp", 443))
    env_proxy, off, own, byenv, unset = chosen
    assert env_proxy == ProxyURL("env.corp", 3128)
    assert off is None
    assert own == ProxyURL("own.corp", 8080)
    assert (
        isinstance(byenv, ProxyURL) and byenv.address == "vault:9" and byenv.password == "pw12345"
    )
    assert isinstance(unset, UnusableProxy) and "UNSET_PROXY is not set" in unset.reason
