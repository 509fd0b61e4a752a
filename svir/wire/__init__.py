"""The sans-IO protocol core: bytes in, typed events out (`events.py`), and back. No sockets, no
asyncio, no clock reads (a clock is passed in). Each fact of the wire-protocol reference lives in
the module that honours it, with the stream it was seen in recorded under tests/conformance/
(a file and a row of that folder's README table); tests/conformance/test_decoder_corpus.py plays
every file whole and in random splits.
"""
