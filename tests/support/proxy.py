"""A forward HTTP proxy and a private CA, both on loopback, for the tests of svir's upstream
client behind a corporate proxy (tests/test_upstream_proxy.py).

`ForwardProxy` takes CONNECT (a tunnel, piped both ways) and absolute-form requests (forwarded
with `Connection: close`, one a connection), records each CONNECT target and request line, can
require Basic credentials (407 without them) or refuse every CONNECT with 407, and sends every
host name to 127.0.0.1 (so an upstream may be named `upstream.test` and still be reached).

`PrivateCA` makes a CA, a server certificate for `localhost`, `upstream.test` and 127.0.0.1
signed by it, and a client certificate (mTLS), as PEM files in a directory.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ipaddress
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["ForwardProxy", "PrivateCA"]


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


@dataclass
class PrivateCA:
    """A CA and the certificates it signed, as PEM files under `root`: `ca` (the CA's
    certificate), `server_cert`/`server_key`, `client_cert`/`client_key`."""

    root: Path
    ca: Path = field(init=False)
    server_cert: Path = field(init=False)
    server_key: Path = field(init=False)
    client_cert: Path = field(init=False)
    client_key: Path = field(init=False)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        now = datetime.datetime.now(datetime.UTC)
        ca_key = _key()
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "svir test CA")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
            )
            .sign(ca_key, hashes.SHA256())
        )

        def issue(
            name: str, usage: x509.ObjectIdentifier, sans: list[x509.GeneralName]
        ) -> tuple[bytes, bytes]:
            key = _key()
            builder = (
                x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(ca_name)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1))
                .not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .add_extension(
                    x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                    critical=False,
                )
            )
            if sans:
                builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
            cert = builder.sign(ca_key, hashes.SHA256())
            return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)

        server_pem, server_key = issue(
            "localhost",
            ExtendedKeyUsageOID.SERVER_AUTH,
            [
                x509.DNSName("localhost"),
                x509.DNSName("upstream.test"),
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            ],
        )
        client_pem, client_key = issue("svir", ExtendedKeyUsageOID.CLIENT_AUTH, [])
        files = {
            "ca": ca_cert.public_bytes(serialization.Encoding.PEM),
            "server_cert": server_pem,
            "server_key": server_key,
            "client_cert": client_pem,
            "client_key": client_key,
        }
        for name, data in files.items():
            path = self.root / f"{name}.pem"
            path.write_bytes(data)
            setattr(self, name, path)

    def server_context(self, *, require_client_cert: bool = False) -> ssl.SSLContext:
        """The TLS context of an upstream with the server certificate; with
        `require_client_cert`, it refuses a client without a certificate this CA signed."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_cert, self.server_key)
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.ca)
        return context


class ForwardProxy:
    """An HTTP forward proxy on 127.0.0.1 (see the module doc). `connects` holds each CONNECT
    target (`host:port`), `request_lines` each request line it got (CONNECT's too),
    `authorizations` each Proxy-Authorization value (None when absent)."""

    def __init__(self, *, credentials: tuple[str, str] | None = None, refuse: bool = False):
        self.credentials = credentials
        self.refuse = refuse
        self.connects: list[str] = []
        self.request_lines: list[str] = []
        self.authorizations: list[str | None] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await self._server.wait_closed()

    def _authorized(self, authorization: str | None) -> bool:
        if self.credentials is None:
            return True
        user, password = self.credentials
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        return authorization == f"Basic {token}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._one(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line, *header_lines = head.decode("latin-1").split("\r\n")
        self.request_lines.append(line)
        headers = {}
        for header in header_lines:
            name, sep, value = header.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        authorization = headers.get("proxy-authorization")
        self.authorizations.append(authorization)
        method, target, _ = line.split(" ", 2)
        if self.refuse or not self._authorized(authorization):
            writer.write(
                b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                b'Proxy-Authenticate: Basic realm="test"\r\nContent-Length: 0\r\n\r\n'
            )
            await writer.drain()
            return
        if method == "CONNECT":
            self.connects.append(target)
            _, _, port = target.rpartition(":")
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await self._pipe(reader, writer, up_reader, up_writer)
            return
        # Absolute form: to the origin in origin form, one request a connection.
        origin = target.split("://", 1)[1]
        authority, slash, path = origin.partition("/")
        _, _, port = authority.rpartition(":")
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", int(port or 80))
        kept = [
            h
            for h in header_lines
            if h
            and h.partition(":")[0].strip().lower() not in ("proxy-authorization", "connection")
        ]
        forwarded = "\r\n".join([f"{method} {slash}{path} HTTP/1.1", *kept, "Connection: close"])
        up_writer.write(forwarded.encode("latin-1") + b"\r\n\r\n")
        await self._pipe(reader, writer, up_reader, up_writer)

    @staticmethod
    async def _pipe(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> None:
        async def copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                dst.close()

        try:
            await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))
        finally:
            up_writer.close()
