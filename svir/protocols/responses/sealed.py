"""Reasoning sealed for a stateless client: an opaque token a Responses client carries in a
reasoning item's `encrypted_content` and sends back, from which svir (and only svir, holding the
key) restores the reasoning text on the next turn.

A token is `svir1.<key id>.<base64url(nonce + AES-GCM ciphertext and tag)>`: AES-GCM makes it
tamper-evident (a changed byte fails the tag, so the text is never trusted), the key id (also
authenticated, as associated data) says which of svir's keys sealed it so that keys can rotate,
and `svir1` is the token format's version. Pure: the 12-byte nonce comes from the caller
(`os.urandom(12)` at the edge), since the wire core reads no random source of its own.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["NONCE_BYTES", "TOKEN_PREFIX", "seal_reasoning", "sealed_key_id", "unseal_reasoning"]

TOKEN_PREFIX: Final = "svir1"
NONCE_BYTES: Final = 12
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")
_KEY_SIZES: Final = (16, 24, 32)
# The tag GCM appends to every ciphertext: a shorter body cannot be a token.
_TAG_BYTES: Final = 16


def _aad(key_id: str) -> bytes:
    # Binds the token's purpose and key id to the ciphertext: a token sealed for another purpose
    # or relabelled with another key id fails the tag.
    return f"{TOKEN_PREFIX}.reasoning.{key_id}".encode()


def seal_reasoning(key: bytes, text: str, *, nonce: bytes, key_id: str = "1") -> str:
    """The token for `text`, sealed under `key` (16, 24 or 32 bytes) with `nonce` (12 bytes,
    fresh for every token: never reuse one under the same key). Raises ValueError for a key,
    nonce or key id of the wrong form."""
    if len(key) not in _KEY_SIZES:
        raise ValueError("an AES-GCM key is 16, 24 or 32 bytes")
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"the nonce is {NONCE_BYTES} bytes")
    if not _KEY_ID.fullmatch(key_id):
        raise ValueError("a key id is 1 to 32 ASCII letters, digits, '_' or '-'")
    sealed = AESGCM(key).encrypt(nonce, text.encode("utf-8", "surrogatepass"), _aad(key_id))
    return f"{TOKEN_PREFIX}.{key_id}.{_b64(nonce + sealed)}"


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def sealed_key_id(token: str) -> str | None:
    """The id of the key a token says sealed it, or None when it is not a svir token."""
    if not isinstance(token, str):
        return None
    prefix, _, rest = token.partition(".")
    key_id, dot, _ = rest.partition(".")
    if prefix != TOKEN_PREFIX or not dot or not _KEY_ID.fullmatch(key_id):
        return None
    return key_id


def unseal_reasoning(keys: bytes | Mapping[str, bytes], token: str) -> str | None:
    """The text sealed in `token`, or None when it is not a svir token, was sealed under another
    key, or was changed in any way. `keys` is one key (for key id "1"), or key id -> key.
    Raises nothing, for any token."""
    key_id = sealed_key_id(token)
    if key_id is None:
        return None
    key = keys if isinstance(keys, bytes) and key_id == "1" else None
    if not isinstance(keys, bytes):
        key = keys.get(key_id)
    if key is None or len(key) not in _KEY_SIZES:
        return None
    body = token[len(TOKEN_PREFIX) + len(key_id) + 2 :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
    except (binascii.Error, ValueError):
        return None
    # Only the one encoding seal_reasoning writes: base64 ignores stray characters and the
    # spare bits of the last one, which would let other strings pass for the same token.
    if len(raw) < NONCE_BYTES + _TAG_BYTES or _b64(raw) != body:
        return None
    try:
        plain = AESGCM(key).decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _aad(key_id))
        return plain.decode("utf-8", "surrogatepass")
    except (InvalidTag, UnicodeDecodeError):
        return None
