"""Large data URLs spliced around the JSON round trip (§2.3)."""

from __future__ import annotations

import base64
import os

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from svir.wire.blobs import MIN_BLOB, extract_blobs, new_token


def body_with(images: list[bytes], text: str = "look") -> bytes:
    content = [{"type": "text", "text": text}]
    for data in images:
        url = "data:image/png;base64," + base64.b64encode(data).decode()
        content.append({"type": "image_url", "image_url": {"url": url}})
    return msgspec.json.encode({"model": "p/m", "messages": [{"role": "user", "content": content}]})


def round_trip(raw: bytes) -> bytes:
    token = new_token(os.urandom(15))
    skeleton, blobs = extract_blobs(bytearray(raw), token)
    decoded = msgspec.json.decode(skeleton)
    encoded = msgspec.json.encode(decoded)
    return b"".join(bytes(p) for p in blobs.splice(encoded))


def test_large_images_are_spliced_back_exactly() -> None:
    images = [os.urandom(MIN_BLOB), os.urandom(3 * MIN_BLOB + 1)]
    raw = body_with(images)
    token = new_token(os.urandom(15))
    skeleton, blobs = extract_blobs(bytearray(raw), token)
    assert len(blobs.views) == 2
    assert len(skeleton) < 1000  # the skeleton holds no image data
    assert msgspec.json.decode(round_trip(raw)) == msgspec.json.decode(raw)


def test_small_bodies_and_small_images_are_left_alone() -> None:
    raw = body_with([b"tiny"])
    skeleton, blobs = extract_blobs(bytearray(raw), new_token(os.urandom(15)))
    assert blobs.views == [] and bytes(skeleton) == raw


def test_a_data_url_inside_a_string_with_an_escaped_quote_is_not_taken() -> None:
    fake = '\\"data:image/png;base64,' + "A" * MIN_BLOB + '\\"'
    raw = msgspec.json.encode({"text": 'say "' + fake[2:-2] + '"', "other": fake})
    assert msgspec.json.decode(round_trip(raw)) == msgspec.json.decode(raw)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 2 * MIN_BLOB), max_size=3), st.text(max_size=50))
def test_any_images_and_text_round_trip(sizes: list[int], text: str) -> None:
    raw = body_with([os.urandom(n) for n in sizes], text)
    assert msgspec.json.decode(round_trip(raw)) == msgspec.json.decode(raw)
