"""svir's TOML configuration: the server's settings and the upstream providers, read into frozen
structs, with every mistake reported as one `ConfigError` naming the file and the field.

`model`: the structs and their defaults; `load`: reading a file (or text) into a checked `Config`,
with msgspec's messages said in TOML's terms; `checks`: what msgspec cannot check (ranges, names,
providers' kinds, files the config names, routes).

Keys never live in the file: a provider names the environment variable that holds its key. Every
secret is read from the environment through `svir.config.model` (`ProviderConfig.api_key`,
`AuthConfig.admin_key`, `AuthConfig.metrics_token`), and reading one hides it from every log line
from then on: whatever svir runs, no log line repeats a key it was given.
"""
