"""Tests for svir.config: loading a TOML file, defaults, every error with its field, and keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from svir.config.load import check_keys, load_config, parse_config
from svir.config.model import Config, ProviderConfig, ServerConfig, Timeouts
from svir.errors import ConfigError

GOOD = """
[server]
host = "0.0.0.0"
port = 8000
max_body_bytes = 1048576
models_cache_ttl = 5

[[providers]]
name = "lab"
kind = "llamacpp"
base_url = "http://127.0.0.1:8080/"
api_key_env = "LAB_KEY"
models = ["gemma-3-270m", "gemma-3-270m"]
discover = false
drop_params = ["temperature"]
extra_headers = { "X-Foo" = "bar" }
relay = true
think_tags = false
[providers.timeouts]
connect = 5
first_byte = 60.5
idle = 30.0

[[providers]]
name = "moon"
kind = "kimi"
api_key_env = "MOONSHOT_API_KEY"

[[providers]]
name = "az"
kind = "azure"
base_url = "https://res.openai.azure.com/"
api_version = "2024-10-21"
"""

# A provider that passes every check, for error cases to add one mistake to.
OK_PROVIDER = '[[providers]]\nname = "ok"\nkind = "vllm"\nbase_url = "http://h:8000"\n'


def write(tmp_path: Path, text: str, name: str = "svir.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(text, source="svir.toml")
    return info.value


# ---------------------------------------------------------------------------------------------
# A good file


def test_good_file_loads(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, GOOD))
    assert config.server == ServerConfig(
        host="0.0.0.0", port=8000, max_body_bytes=1048576, models_cache_ttl=5.0
    )
    lab, moon, az = config.providers
    assert lab == ProviderConfig(
        name="lab",
        kind="llamacpp",
        base_url="http://127.0.0.1:8080/v1",
        api_key_env="LAB_KEY",
        models=("gemma-3-270m",),
        discover=False,
        drop_params=("temperature",),
        extra_headers={"X-Foo": "bar"},
        relay=True,
        think_tags=False,
        timeouts=Timeouts(connect=5.0, first_byte=60.5, idle=30.0),
    )
    # A hosted kind with no base_url gets its public endpoint.
    assert moon.base_url == "https://api.moonshot.ai/v1"
    assert az.base_url == "https://res.openai.azure.com"
    assert config.provider("moon") is moon
    assert config.provider("nope") is None


def test_load_config_accepts_a_str_path(tmp_path: Path) -> None:
    assert load_config(str(write(tmp_path, GOOD))).providers[0].name == "lab"


def test_defaults() -> None:
    config = parse_config('[[providers]]\nname = "lab"\nkind = "llamacpp"\nbase_url = "http://h"')
    assert config.server == ServerConfig(
        host="127.0.0.1", port=11434, max_body_bytes=64 * 1024 * 1024, models_cache_ttl=60.0
    )
    (lab,) = config.providers
    assert lab.base_url == "http://h/v1"
    assert lab.api_key_env is None
    assert lab.models == ()
    assert lab.discover is None
    assert lab.drop_params is None
    assert lab.extra_headers == {}
    assert lab.relay is False
    assert lab.think_tags is None
    assert lab.api_version is None
    assert lab.timeouts == Timeouts(connect=10.0, first_byte=300.0, idle=120.0)


def test_default_config_has_no_providers() -> None:
    config = Config.default()
    assert config.providers == ()
    assert config.server == ServerConfig()
    assert parse_config("") == config


def test_empty_drop_params_is_kept_apart_from_unset() -> None:
    config = parse_config(OK_PROVIDER + "drop_params = []")
    assert config.providers[0].drop_params == ()


def test_utf8_bom_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + OK_PROVIDER.encode())
    assert load_config(path).providers[0].name == "ok"


@pytest.mark.parametrize(
    ("base_url", "expected"),
    [
        ("http://h:8080", "http://h:8080/v1"),
        ("http://h:8080/v1/", "http://h:8080/v1"),
        ("https://h/api/v1", "https://h/api/v1"),
    ],
)
def test_base_url_is_normalized(base_url: str, expected: str) -> None:
    config = parse_config(f'[[providers]]\nname = "a"\nkind = "lmstudio"\nbase_url = "{base_url}"')
    assert config.providers[0].base_url == expected


@pytest.mark.parametrize(
    "base_url",
    [
        "https://res.openai.azure.com",
        "https://res.openai.azure.com/",
        "https://res.openai.azure.com/openai",
        "https://res.openai.azure.com/openai/v1/",
    ],
)
def test_azure_base_url_is_the_resource(base_url: str) -> None:
    config = parse_config(
        f'[[providers]]\nname = "az"\nkind = "azure"\nbase_url = "{base_url}"\napi_version = "v1"'
    )
    assert config.providers[0].base_url == "https://res.openai.azure.com"


def test_gemini_base_url_gets_no_v1() -> None:
    written = "https://generativelanguage.googleapis.com/v1beta/openai/"
    config = parse_config(f'[[providers]]\nname = "g"\nkind = "gemini"\nbase_url = "{written}"')
    assert config.providers[0].base_url == "https://generativelanguage.googleapis.com/v1beta/openai"


# ---------------------------------------------------------------------------------------------
# Errors, each naming the file and the field


def test_error_str_is_file_field_reason() -> None:
    error = ConfigError("svir.toml", "providers[1].kind", "unknown kind 'foo'")
    assert str(error) == "svir.toml: providers[1].kind: unknown kind 'foo'"
    assert (error.path, error.field, error.reason) == (
        "svir.toml",
        "providers[1].kind",
        "unknown kind 'foo'",
    )
    assert str(ConfigError("svir.toml", None, "oops")) == "svir.toml: oops"


def test_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert info.value.field is None
    assert str(info.value).startswith(f"{missing}: cannot read the file")


def test_directory_is_unreadable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(tmp_path)


def test_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin.toml"
    path.write_bytes(b'[server]\nhost = "\xe9"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(path)


def test_toml_syntax_error_has_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nhost = "a"\nport = \n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.field is None
    assert str(info.value).startswith(f"{path}: TOML syntax error: ")
    assert "line 3" in str(info.value)


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("colour = 1", "colour", "unknown field"),
        ("[server]\nprot = 1", "server.prot", "unknown field (did you mean 'port'?)"),
        (
            OK_PROVIDER + "api_kye_env = 'X'",
            "providers[0].api_kye_env",
            "unknown field (did you mean 'api_key_env'?)",
        ),
        (
            OK_PROVIDER + "[providers.timeouts]\nconect = 1",
            "providers[0].timeouts.conect",
            "unknown field (did you mean 'connect'?)",
        ),
    ],
)
def test_unknown_field(text: str, field: str, reason: str) -> None:
    error = error_of(text)
    assert (error.field, error.reason) == (field, reason)
    assert str(error) == f"svir.toml: {field}: {reason}"


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ('[server]\nport = "80"', "server.port", "expected an integer, got a string"),
        ("[server]\nport = true", "server.port", "expected an integer, got a boolean"),
        ("[server]\nmodels_cache_ttl = 'x'", "server.models_cache_ttl", "expected a number"),
        ("server = 1", "server", "expected a table, got an integer"),
        (OK_PROVIDER + "models = 'm'", "providers[0].models", "expected an array, got a string"),
        (OK_PROVIDER + "relay = 'yes'", "providers[0].relay", "expected a boolean"),
        (
            OK_PROVIDER + OK_PROVIDER.replace('"ok"', '"b"') + "discover = 1",
            "providers[1].discover",
            "expected a boolean",
        ),
        (OK_PROVIDER + "[providers.timeouts]\nidle = '9'", "providers[0].timeouts.idle", "number"),
        (
            '[providers]\nname = "a"\nkind = "vllm"',
            "providers",
            "expected an array, got a table (write [[providers]]",
        ),
    ],
)
def test_wrong_type(text: str, field: str, reason: str) -> None:
    error = error_of(text)
    assert error.field == field
    assert reason in error.reason


def test_missing_required_fields() -> None:
    assert error_of('[[providers]]\nkind = "vllm"').field == "providers[0].name"
    error = error_of('[[providers]]\nname = "a"')
    assert (error.field, error.reason) == ("providers[0].kind", "is required")


def test_unknown_kind_lists_the_known_ones() -> None:
    error = error_of(OK_PROVIDER + '[[providers]]\nname = "b"\nkind = "foo"\nbase_url = "http://h"')
    assert error.field == "providers[1].kind"
    assert error.reason.startswith("unknown kind 'foo' (known: anthropic, azure, gemini, kimi,")
    assert "openai-compatible" in error.reason


def test_managed_llamacpp_needs_its_table() -> None:
    # More in tests/managed/test_managed_config.py.
    error = error_of('[[providers]]\nname = "a"\nkind = "llamacpp-managed"\nbase_url = "http://h"')
    assert error.field == "providers[0].managed"


def test_duplicate_provider_name() -> None:
    error = error_of(OK_PROVIDER + OK_PROVIDER)
    assert error.field == "providers[1].name"
    assert error.reason == "duplicate provider name 'ok' (also providers[0])"


@pytest.mark.parametrize("name", ["", "a b", "lab/x", "ü", "a:b"])
def test_bad_name(name: str) -> None:
    error = error_of(f'[[providers]]\nname = "{name}"\nkind = "vllm"\nbase_url = "http://h"')
    assert error.field == "providers[0].name"
    assert "not a valid name" in error.reason


def test_good_names() -> None:
    for name in ("a", "lab-2", "my.lab_x", "UPPER"):
        parse_config(f'[[providers]]\nname = "{name}"\nkind = "vllm"\nbase_url = "http://h"')


@pytest.mark.parametrize(
    ("base_url", "reason"),
    [
        ("ftp://h", "base URL scheme must be http or https"),
        ("h:8080", "base URL"),
        ("http://user:secret@h", "must not contain credentials"),
        ("http://h/v1/chat/completions", "names an endpoint"),
        ("http://h?x=1", "must not contain a query"),
    ],
)
def test_bad_base_url(base_url: str, reason: str) -> None:
    error = error_of(f'[[providers]]\nname = "a"\nkind = "vllm"\nbase_url = "{base_url}"')
    assert error.field == "providers[0].base_url"
    assert reason in error.reason
    assert "secret" not in str(error)


def test_local_kind_needs_a_base_url() -> None:
    error = error_of('[[providers]]\nname = "a"\nkind = "llamacpp"')
    assert error.field == "providers[0].base_url"
    assert "required" in error.reason


@pytest.mark.parametrize("key", ["connect", "first_byte", "idle"])
@pytest.mark.parametrize("value", ["0", "-1", "0.0", "nan", "inf"])
def test_bad_timeout(key: str, value: str) -> None:
    error = error_of(OK_PROVIDER + f"[providers.timeouts]\n{key} = {value}")
    assert error.field == f"providers[0].timeouts.{key}"
    assert "above 0" in error.reason


@pytest.mark.parametrize("value", ["-1", "-0.5", "nan", "inf"])
def test_bad_commit_deadline(value: str) -> None:
    error = error_of(OK_PROVIDER + f"[providers.timeouts]\ncommit_deadline = {value}")
    assert error.field == "providers[0].timeouts.commit_deadline"
    assert "0 or more" in error.reason and "at once" in error.reason


def test_commit_deadline_defaults_to_five_seconds_and_takes_zero() -> None:
    assert parse_config(OK_PROVIDER).providers[0].timeouts.commit_deadline == 5.0
    zero = parse_config(OK_PROVIDER + "[providers.timeouts]\ncommit_deadline = 0")
    assert zero.providers[0].timeouts.commit_deadline == 0.0


def test_azure_without_api_version() -> None:
    error = error_of('[[providers]]\nname = "az"\nkind = "azure"\nbase_url = "https://r"')
    assert error.field == "providers[0].api_version"
    assert "azure needs an api_version" in error.reason


def test_api_version_on_another_kind() -> None:
    error = error_of(OK_PROVIDER + 'api_version = "v1"')
    assert error.field == "providers[0].api_version"
    assert "azure" in error.reason


@pytest.mark.parametrize("key", ["api_key", "api-key", "apiKey", "key", "token"])
def test_inline_key_is_rejected_without_showing_it(key: str) -> None:
    error = error_of(OK_PROVIDER + f'"{key}" = "sk-live-123"')
    assert error.field == f"providers[0].{key}"
    assert "environment variable" in error.reason
    assert "sk-live-123" not in str(error)


def test_api_key_env_holding_a_key_is_not_shown() -> None:
    error = error_of(OK_PROVIDER + 'api_key_env = "sk-live-123"')
    assert error.field == "providers[0].api_key_env"
    assert "sk-live-123" not in str(error)


def test_auth_header_in_extra_headers_is_rejected() -> None:
    error = error_of(OK_PROVIDER + '[providers.extra_headers]\nAuthorization = "Bearer sk-9"')
    assert error.field == "providers[0].extra_headers.Authorization"
    assert "api_key_env" in error.reason
    assert "sk-9" not in str(error)


@pytest.mark.parametrize(
    ("headers", "reason"),
    [('"Bad Name" = "x"', "not a valid header name"), ('X-A = "a\\r\\nB: c"', "line breaks")],
)
def test_bad_extra_headers(headers: str, reason: str) -> None:
    error = error_of(OK_PROVIDER + f"[providers.extra_headers]\n{headers}")
    assert error.field is not None
    assert error.field.startswith("providers[0].extra_headers.")
    assert reason in error.reason


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("drop_params = ['model']", "providers[0].drop_params[0]"),
        ("drop_params = ['top_p', 'stream_options']", "providers[0].drop_params[1]"),
        ("drop_params = ['']", "providers[0].drop_params[0]"),
        ("models = ['a', ' ']", "providers[0].models[1]"),
    ],
)
def test_bad_lists(line: str, field: str) -> None:
    assert error_of(OK_PROVIDER + line).field == field


@pytest.mark.parametrize(
    ("line", "field"),
    [
        ("port = 70000", "server.port"),
        ("port = -1", "server.port"),
        ("max_body_bytes = 0", "server.max_body_bytes"),
        ("models_cache_ttl = -1.0", "server.models_cache_ttl"),
        ("host = ''", "server.host"),
    ],
)
def test_bad_server_settings(line: str, field: str) -> None:
    assert error_of(f"[server]\n{line}").field == field


def test_max_unlisted_models() -> None:
    assert parse_config("").server.max_unlisted_models == 1000
    assert parse_config("[server]\nmax_unlisted_models = 0").server.max_unlisted_models == 0
    error = error_of("[server]\nmax_unlisted_models = -1")
    assert error.field == "server.max_unlisted_models"
    assert "0 or more" in error.reason


def test_error_source_defaults_to_a_placeholder() -> None:
    with pytest.raises(ConfigError, match=r"^<string>: colour: unknown field$"):
        parse_config("colour = 1")


# ---------------------------------------------------------------------------------------------
# Keys from the environment


def provider(api_key_env: str | None, kind: str = "llamacpp") -> ProviderConfig:
    return ProviderConfig(name="p", kind=kind, base_url="http://h/v1", api_key_env=api_key_env)


def test_api_key_is_read_from_the_environment() -> None:
    assert provider("LAB_KEY").api_key({"LAB_KEY": "sk-1"}) == "sk-1"


def test_missing_or_empty_variable_gives_none() -> None:
    assert provider("LAB_KEY").api_key({}) is None
    assert provider("LAB_KEY").api_key({"LAB_KEY": ""}) is None
    assert provider(None).api_key({"LAB_KEY": "sk-1"}) is None


def test_api_key_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SVIR_TEST_KEY", "sk-env")
    assert provider("SVIR_TEST_KEY").api_key() == "sk-env"


def test_check_keys_warns_without_showing_keys() -> None:
    config = Config(
        providers=(
            ProviderConfig(name="set", kind="openai", base_url="u", api_key_env="SET_KEY"),
            ProviderConfig(name="unset", kind="llamacpp", base_url="u", api_key_env="LAB_KEY"),
            ProviderConfig(name="hosted", kind="openrouter", base_url="u"),
            ProviderConfig(name="local", kind="lmstudio", base_url="u"),
        )
    )
    warnings = check_keys(config, {"SET_KEY": "sk-secret"})
    assert len(warnings) == 2
    assert "'unset'" in warnings[0]
    assert "LAB_KEY" in warnings[0]
    assert "'hosted'" in warnings[1]
    assert all("sk-secret" not in w for w in warnings)


def test_check_keys_is_quiet_when_all_is_well() -> None:
    assert check_keys(Config.default(), {}) == []
    config = Config(providers=(provider("LAB_KEY"),))
    assert check_keys(config, {"LAB_KEY": "k"}) == []


def test_repr_holds_no_key() -> None:
    assert "sk-1" not in repr(provider("LAB_KEY"))


def test_the_example_config_loads() -> None:
    from pathlib import Path

    from svir.config.load import load_config

    config = load_config(Path(__file__).parent.parent / "svir.example.toml")
    assert [p.name for p in config.providers] == ["lab", "studio", "openai", "azure"]


def test_metrics_access_settings_are_checked() -> None:
    error = error_of("[auth]\nmetrics_public = true\nmetrics_need_admin = true\n")
    assert (error.path, error.field) == ("svir.toml", "auth.metrics_public")
    assert "metrics_need_admin" in error.reason and "set one of them" in error.reason
    error = error_of('[auth]\nmetrics_token_env = "tok-3n value"\n')
    assert error.field == "auth.metrics_token_env"
    assert "tok-3n" not in str(error)  # it may be the token itself
    auth = parse_config('[auth]\nmetrics_token_env = "MY_TOKEN"\nmetrics_public = true\n').auth
    assert auth.metrics_token({"MY_TOKEN": "t0ken"}) == "t0ken" and auth.metrics_public


# ---------------------------------------------------------------------------------------------
# How svir reaches a provider: proxy, proxy_env, ca_file, client_cert, client_key


def _tls_provider(base: str, extra: str) -> str:
    return (
        f'[[providers]]\nname = "corp"\nkind = "openai-compatible"\nbase_url = "{base}"\n{extra}\n'
    )


def _load_error(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    return info.value


def test_network_fields_load_with_paths_from_the_config_file(tmp_path: Path) -> None:
    from tests.support.proxy import PrivateCA

    ca = PrivateCA(tmp_path / "pki")
    extra = (
        'proxy = "http://proxy.corp:3128"\nca_file = "pki/ca.pem"\n'
        'client_cert = "pki/client_cert.pem"\nclient_key = "pki/client_key.pem"'
    )
    config = load_config(write(tmp_path, _tls_provider("https://api.corp/v1", extra)))
    p = config.providers[0]
    assert p.proxy == "http://proxy.corp:3128"
    assert (p.ca_file, p.client_cert, p.client_key) == (
        str(ca.ca),
        str(ca.client_cert),
        str(ca.client_key),
    )
    direct = parse_config(_tls_provider("https://api.corp/v1", "proxy = false"))
    assert direct.providers[0].proxy is False


@pytest.mark.parametrize(
    ("extra", "field", "says"),
    [
        ('proxy = "socks5://p:1080"', "proxy", "http:// only"),
        ('proxy = "http://p:99999"', "proxy", "write it as http://host:port"),
        ("proxy = true", "proxy", "or false to go direct"),
        ('proxy = "http://u:hunter22@p:3128"', "proxy", "name that variable in proxy_env"),
        ('proxy_env = "http://p:3128"', "proxy_env", "name of an environment variable"),
        ('proxy = "http://p:3128"\nproxy_env = "CORP_PROXY"', "proxy_env", "not both"),
        ('ca_file = "missing.pem"', "ca_file", "no such file"),
        ('ca_file = ""', "ca_file", "must not be empty"),
        ('client_key = "svir.toml"', "client_key", "needs client_cert"),
    ],
)
def test_network_field_errors(tmp_path: Path, extra: str, field: str, says: str) -> None:
    error = _load_error(tmp_path, _tls_provider("https://api.corp/v1", extra))
    assert error.field == f"providers[0].{field}", error
    assert says in error.reason, error
    assert str(tmp_path / "svir.toml") in str(error)
    assert "hunter22" not in str(error)


def test_tls_files_must_be_what_they_say(tmp_path: Path) -> None:
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    error = _load_error(tmp_path, _tls_provider("https://api.corp/v1", 'ca_file = "junk.pem"'))
    assert error.field == "providers[0].ca_file" and "PEM bundle" in error.reason, error
    error = _load_error(tmp_path, _tls_provider("https://api.corp/v1", 'client_cert = "junk.pem"'))
    assert error.field == "providers[0].client_cert" and "cannot be loaded" in error.reason


def test_tls_files_need_an_https_base_url(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("x")
    error = _load_error(tmp_path, _tls_provider("http://api.corp/v1", 'ca_file = "ca.pem"'))
    assert error.field == "providers[0].ca_file" and "https://" in error.reason, error


def test_a_managed_provider_takes_no_proxy() -> None:
    text = (
        '[[providers]]\nname = "local"\nkind = "llamacpp-managed"\nproxy = "http://p:3128"\n'
        '[providers.managed]\nmodels = { gemma = "pypi:gemma3-270m" }\n'
    )
    error = error_of(text)
    assert error.field == "providers[0].proxy" and "never through a proxy" in error.reason, error


def test_proxy_passwords_are_hidden_from_logs() -> None:
    config = parse_config(_tls_provider("https://api.corp/v1", 'proxy_env = "CORP_PROXY"'))
    env = {
        "HTTPS_PROXY": "http://svc:env-proxy-pass-1@proxy:3128",
        "CORP_PROXY": "http://svc:own-proxy-pass-2@vault:9",
        "http_proxy": "socks5://svc:unusable-pass-3@p:1080/",
    }
    hidden = config.secrets(env)
    assert {"env-proxy-pass-1", "own-proxy-pass-2"} <= set(hidden)
    # A URL svir cannot read is hidden whole: it may hold a password anywhere.
    assert env["http_proxy"] in hidden
