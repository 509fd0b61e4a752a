"""svir.wire.origins: the Origin and Host headers read, the patterns of allowed origins and hosts
parsed (with what is wrong with a bad one said), and the verdicts on both."""

from __future__ import annotations

import pytest

from svir.wire.origins import (
    NULL_ORIGIN,
    Origin,
    OriginPolicy,
    PatternError,
    parse_host,
    parse_host_pattern,
    parse_origin,
    parse_origin_pattern,
    split_list,
)


@pytest.mark.parametrize(
    ("value", "origin"),
    [
        ("http://localhost:5173", Origin("http", "localhost", "5173")),
        ("HTTPS://App.Example.COM", Origin("https", "app.example.com", None)),
        ("https://app.example.com:443", Origin("https", "app.example.com", None)),
        ("http://[::1]:8080", Origin("http", "::1", "8080")),
        ("vscode-webview://1abc2def", Origin("vscode-webview", "1abc2def", None)),
        ("file://", Origin("file", "", None)),
        ("null", NULL_ORIGIN),
    ],
)
def test_an_origin_as_browsers_send_it(value: str, origin: Origin) -> None:
    assert parse_origin(value) == origin


@pytest.mark.parametrize(
    "value",
    [
        "",
        "localhost",
        "http://x.com/",
        "http://x.com:port",
        "http://u@x.com",
        "http://[::1",
        "1://x",
    ],
)
def test_what_is_not_an_origin(value: str) -> None:
    assert parse_origin(value) is None


@pytest.mark.parametrize(
    ("value", "host"),
    [
        ("127.0.0.1:11434", "127.0.0.1"),
        ("LocalHost", "localhost"),
        ("[::1]:11434", "::1"),
        ("svir.example.com.", "svir.example.com"),
    ],
)
def test_a_host_header(value: str, host: str) -> None:
    assert parse_host(value) == host


@pytest.mark.parametrize("value", ["x.com:abc", "::1", "[::1]x", ":80"])
def test_what_is_not_a_host(value: str) -> None:
    assert parse_host(value) is None


DEFAULT = OriginPolicy(hostname="laptop")


@pytest.mark.parametrize(
    "origin",
    [
        "http://localhost",
        "http://localhost:3000",
        "https://localhost:8443",
        "http://127.0.0.1:11434",
        "http://127.1.2.3",
        "http://[::1]:5173",
        "http://app.localhost:3000",
        "http://0.0.0.0:8080",
        "app://obsidian.md",
        "file://",
        "tauri://localhost",
        "vscode-webview://1abc2def",
        "vscode-file://vscode-app",
    ],
)
def test_pages_of_this_machine_and_apps_are_allowed_without_saying(origin: str) -> None:
    assert DEFAULT.origin_allowed(origin)


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example",
        "https://localhost.evil.example",
        "http://127.0.0.1.evil.example",
        "null",
        "ftp://localhost",
        "chrome-extension://abcdef",
        "http://192.168.1.5:11434",
        "garbage",
    ],
)
def test_other_pages_are_refused_by_default(origin: str) -> None:
    assert not DEFAULT.origin_allowed(origin)


def policy(*origins: str) -> OriginPolicy:
    return OriginPolicy([parse_origin_pattern(o) for o in origins])


def test_patterns_as_ollama_origins_take_them() -> None:
    subdomains = policy("https://*.example.com")
    assert subdomains.origin_allowed("https://app.example.com")
    assert subdomains.origin_allowed("https://a.b.example.com")
    assert not subdomains.origin_allowed("https://example.com")  # the name itself is not under it
    assert not subdomains.origin_allowed("https://evilexample.com")
    assert not subdomains.origin_allowed("http://app.example.com")  # another scheme
    assert not subdomains.origin_allowed("https://app.example.com:8443")  # another port

    any_port = policy("http://dev.lan:*")
    assert any_port.origin_allowed("http://dev.lan:3000")
    assert any_port.origin_allowed("http://dev.lan")

    extensions = policy("chrome-extension://*")
    assert extensions.origin_allowed("chrome-extension://abcdef")
    assert not extensions.origin_allowed("moz-extension://abcdef")

    exact = policy("https://app.example.com:443")  # the default port is no port
    assert exact.origin_allowed("https://app.example.com")

    assert policy("null").origin_allowed("null")
    everything = policy("*")
    assert everything.origin_allowed("https://anything.example") and everything.origin_allowed(
        "null"
    )


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("", "an empty entry"),
        ("app.example.com", "is not an origin: write scheme://host[:port]"),
        ("https://app.example.com/", "an origin has no path, and a browser sends none: write"),
        ("https://app.example.com/chat", "write https://app.example.com"),
        ("https://app*.example.com", "* may stand for the whole host or its first label"),
        ("https://app.example.com:99999", "the port must be a number from 1 to 65535"),
        ("https://", "names no host"),
        ("https://user@app.example.com", "is not an origin"),
        ("https://exa mple.com", "is not an origin"),
        ("https://exa$mple.com", "is not a host name"),
    ],
)
def test_a_bad_origin_pattern_says_what_to_write(entry: str, says: str) -> None:
    with pytest.raises(PatternError) as caught:
        parse_origin_pattern(entry)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("", "an empty entry"),
        ("http://svir.lan", "without scheme or path"),
        ("svir.lan:11434", "without a port"),
        ("sv*r.lan", "* may stand for the whole host or its first label"),
        ("svir lan", "is not a host name"),
    ],
)
def test_a_bad_host_pattern_says_what_to_write(entry: str, says: str) -> None:
    with pytest.raises(PatternError) as caught:
        parse_host_pattern(entry)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:11434",
        "app.localhost:11434",
        "127.0.0.1:11434",
        "127.0.0.2",
        "[::1]:11434",
        "0.0.0.0:11434",
        "192.168.1.5:11434",
        "laptop:11434",
        "LAPTOP.",
        "",
    ],
)
def test_hosts_answered_without_saying(host: str) -> None:
    assert DEFAULT.host_allowed(host)


@pytest.mark.parametrize(
    "host",
    ["rebind.attacker.example", "rebind.attacker.example:11434", "localhost.evil.example", "x:y"],
)
def test_other_names_are_refused(host: str) -> None:
    assert not DEFAULT.host_allowed(host)


def test_host_patterns_add_names() -> None:
    hosts = OriginPolicy(hosts=[parse_host_pattern("svir.lan"), parse_host_pattern("*.corp")])
    assert hosts.host_allowed("svir.lan:11434") and hosts.host_allowed("SVIR.LAN")
    assert hosts.host_allowed("a.b.corp")
    assert not hosts.host_allowed("corp") and not hosts.host_allowed("svir.lan.evil.example")
    assert OriginPolicy(hosts=[parse_host_pattern("*")]).host_allowed("anything.example")


def test_an_environment_list_as_ollama_reads_it() -> None:
    assert split_list(' "https://a.example, https://b.example:8443 ,," ') == [
        "https://a.example",
        "https://b.example:8443",
    ]
    assert split_list("") == []
