"""The environment an npm agent under test (Claude Code, the Continue CLI) runs in: a home of its
own, and proxies pointed at a closed loopback port, so that what honours them sends nothing out.
Node's own `fetch` does not: `LOOPBACK_GUARD`, preloaded with `NODE_OPTIONS=--require`, refuses
any connection past loopback and writes its host to `$SVIR_BLOCKED_LOG`."""

from __future__ import annotations

import os
from pathlib import Path

from tests.support.svir_proc import free_port

__all__ = ["LOOPBACK_GUARD", "agent_env"]

LOOPBACK_GUARD = Path(__file__).parent / "node" / "loopback-only.cjs"


def agent_env(home: Path, **extra: str) -> dict[str, str]:
    """PATH, HOME and the closed proxies, then `extra`."""
    closed = f"http://127.0.0.1:{free_port()}"
    return {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "HTTPS_PROXY": closed,
        "HTTP_PROXY": closed,
        "NO_PROXY": "127.0.0.1,localhost",
        **extra,
    }
