"""The proxy decision (svir.wire.proxy), pure: `no_proxy` as curl documents it (a domain matches
itself and its subdomains, a leading dot changes nothing, `*` matches all, addresses and CIDRs
match addresses) plus ports; the variables in curl's order; proxy URLs; the CONNECT exchange.
Fuzzed: no input crashes the parser or the matcher."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from svir.wire.proxy import (
    ConnectRefused,
    NoProxy,
    ProxyURL,
    ProxyURLError,
    UnusableProxy,
    connect_request,
    explicit_proxy,
    is_loopback,
    parse_connect_head,
    parse_proxy_url,
    rules_from_env,
)


@pytest.mark.parametrize(
    ("no_proxy", "host", "port", "direct"),
    [
        # curl's own examples: local.com matches local.com and www.local.com, not notlocal.com.
        ("local.com", "local.com", 443, True),
        ("local.com", "www.local.com", 443, True),
        ("local.com", "notlocal.com", 443, False),
        ("local.com", "local.com.evil.net", 443, False),
        (".local.com", "local.com", 443, True),
        (".local.com", "a.b.local.com", 443, True),
        ("*.local.com", "a.local.com", 443, True),
        ("LOCAL.COM", "www.Local.Com", 443, True),
        ("local.com.", "local.com", 443, True),
        ("local.com", "local.com.", 443, True),
        ("*", "anything.example", 443, True),
        ("a.com,*", "anything.example", 443, True),
        (" a.com , b.com ", "b.com", 443, True),
        ("a.com b.com", "b.com", 443, True),
        ("", "b.com", 443, False),
        (",,,", "b.com", 443, False),
        # Ports: this port only.
        ("api.corp:8443", "api.corp", 8443, True),
        ("api.corp:8443", "api.corp", 443, False),
        (".corp:443", "x.corp", 443, True),
        # Addresses and CIDRs match addresses, never names.
        ("10.1.2.3", "10.1.2.3", 443, True),
        ("10.1.2.3", "10.1.2.4", 443, False),
        ("10.0.0.0/8", "10.200.0.1", 443, True),
        ("10.0.0.0/8", "11.0.0.1", 443, False),
        ("192.168.0.0/16", "192.168.44.1", 80, True),
        ("10.0.0.0/8", "ten.example", 443, False),
        ("10.0.0.0/8:443", "10.0.0.1", 443, True),
        ("10.0.0.0/8:443", "10.0.0.1", 80, False),
        ("10.0.0.0/33", "10.0.0.1", 443, False),  # not a network: matches nothing
        ("fd00::/8", "fd12::1", 443, True),
        ("fd00::/8", "[fd12::1]", 443, True),
        ("::1", "::1", 443, True),
        ("[::1]:8080", "::1", 8080, True),
        ("[::1]:8080", "::1", 443, False),
        ("10.0.0.0/8", "fd12::1", 443, False),
    ],
)
def test_no_proxy_examples(no_proxy: str, host: str, port: int, direct: bool) -> None:
    assert NoProxy(no_proxy).matches(host, port) is direct


hosts = st.one_of(
    st.from_regex(r"[a-z0-9-]{1,10}(\.[a-z0-9-]{1,10}){0,3}", fullmatch=True),
    st.ip_addresses().map(str),
    st.text(max_size=30),
)


@given(st.text(max_size=200), hosts, st.integers(min_value=0, max_value=70000))
def test_no_proxy_never_crashes(text: str, host: str, port: int) -> None:
    assert NoProxy(text).matches(host, port) in (True, False)


@given(st.lists(st.from_regex(r"[a-z][a-z0-9]{0,7}", fullmatch=True), min_size=1, max_size=4))
def test_a_domain_matches_its_subdomains_with_or_without_the_dot(labels: list[str]) -> None:
    domain = ".".join(labels)
    for entry in (domain, "." + domain):
        rules = NoProxy(entry)
        assert rules.matches(domain, 443)
        assert rules.matches(f"x.{domain}", 443)
        assert not rules.matches(f"x{domain}", 443)


def test_variables_in_curls_order() -> None:
    env = {
        "https_proxy": "http://lower:1",
        "HTTPS_PROXY": "http://upper:2",
        "HTTP_PROXY": "http://plain:3",
        "ALL_PROXY": "http://all:4",
        "NO_PROXY": "skip.me",
    }
    rules = rules_from_env(env)
    assert rules.proxy_for("https", "api.example", 443) == ProxyURL("lower", 1)
    assert rules.proxy_for("http", "api.example", 80) == ProxyURL("plain", 3)
    assert rules.proxy_for("https", "skip.me", 443) is None
    only_all = rules_from_env({"all_proxy": "http://all:4", "HTTPS_PROXY": ""})
    assert only_all.proxy_for("https", "api.example", 443) == ProxyURL("all", 4)
    assert only_all.proxy_for("http", "api.example", 80) == ProxyURL("all", 4)
    assert rules_from_env({}).proxy_for("https", "api.example", 443) is None


@pytest.mark.parametrize(
    "host", ["localhost", "LOCALHOST.", "gpu.localhost", "127.0.0.1", "127.9.9.9", "::1", "[::1]"]
)
def test_loopback_never_takes_the_environments_proxy(host: str) -> None:
    assert is_loopback(host)
    rules = rules_from_env({"HTTPS_PROXY": "http://p:3128", "HTTP_PROXY": "http://p:3128"})
    assert rules.proxy_for("https", host, 443) is None
    assert rules.proxy_for("http", host, 80) is None
    # A provider's own proxy takes it; no_proxy still applies to that one.
    assert explicit_proxy(ProxyURL("p", 3128)).proxy_for("https", host, 443) == ProxyURL("p", 3128)
    nope = NoProxy("*")
    assert explicit_proxy(ProxyURL("p", 3128), nope).proxy_for("https", host, 443) is None


@pytest.mark.parametrize("host", ["localhost.example", "10.0.0.1", "::2", "0.0.0.0", "example"])
def test_not_loopback(host: str) -> None:
    assert not is_loopback(host)


def test_proxy_urls() -> None:
    plain = parse_proxy_url("http://proxy.corp:3128")
    assert (plain.host, plain.port, plain.authorization) == ("proxy.corp", 3128, None)
    assert parse_proxy_url("proxy.corp").port == 1080  # curl's default
    assert parse_proxy_url("HTTP://Proxy.Corp:8080/").address == "proxy.corp:8080"
    assert parse_proxy_url("http://[fd00::1]:3128").address == "[fd00::1]:3128"
    creds = parse_proxy_url("http://svc%40corp:p%3Ass@proxy:3128")
    assert creds.authorization == "Basic " + base64.b64encode(b"svc@corp:p:ss").decode()
    assert creds.password == "p:ss"
    assert "p:ss" not in repr(creds) and "cDpzcw" not in repr(creds)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("socks5://proxy:1080", "socks5"),
        ("https://proxy:443", "http:// only"),
        ("http://proxy:99999", "valid host and port"),
        ("http://:3128", "no host"),
        ("http://proxy:3128/path", "no path"),
        ("http://user:secret@proxy:x", "valid host and port"),
    ],
)
def test_bad_proxy_urls_never_show_the_url(text: str, says: str) -> None:
    with pytest.raises(ProxyURLError, match=says) as info:
        parse_proxy_url(text)
    assert "secret" not in str(info.value)


def test_an_unusable_variable_is_kept_as_unusable() -> None:
    rules = rules_from_env({"HTTPS_PROXY": "socks5://user:pw@p:1080"})
    proxy = rules.proxy_for("https", "api.example", 443)
    assert isinstance(proxy, UnusableProxy)
    assert proxy.source == "HTTPS_PROXY" and "pw" not in proxy.reason


@given(st.text(max_size=80))
def test_proxy_url_parsing_never_crashes(text: str) -> None:
    try:
        proxy = parse_proxy_url(text)
    except ProxyURLError:
        return
    assert proxy.host and 0 < proxy.port < 65536


def test_connect_exchange() -> None:
    assert connect_request("api.example", 443, "Basic eDp5") == (
        b"CONNECT api.example:443 HTTP/1.1\r\nHost: api.example:443\r\n"
        b"Proxy-Authorization: Basic eDp5\r\n\r\n"
    )
    assert connect_request("::1", 8443, None).startswith(b"CONNECT [::1]:8443 HTTP/1.1\r\n")
    assert parse_connect_head(b"HTTP/1.1 200 Connection established\r\n") is None
    assert parse_connect_head(b"HTTP/1.0 200 OK\r\nVia: x\r\n\r\n") == 200
    with pytest.raises(ConnectRefused) as info:
        parse_connect_head(b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n")
    assert info.value.status == 407 and str(info.value) == "407 Proxy Authentication Required"
    with pytest.raises(ConnectRefused, match="not HTTP"):
        parse_connect_head(b"SSH-2.0-OpenSSH\r\n\r\n")
    with pytest.raises(ConnectRefused, match="no end"):
        parse_connect_head(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 4000)


@given(st.binary(max_size=300))
def test_connect_heads_never_crash(data: bytes) -> None:
    try:
        status = parse_connect_head(data)
    except ConnectRefused:
        return
    assert status is None or 200 <= status < 300
