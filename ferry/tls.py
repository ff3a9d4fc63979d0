"""Transport security for Ferry's channels: mutual TLS inside, TLS on the public API.

Every component takes ``--tls-ca``, ``--tls-cert`` and ``--tls-key`` (PEM files)
or an explicit ``--insecure`` for plain text (:func:`add_arguments`,
:func:`from_args`). Internal servers (control plane, replicas behind the agent)
require a client certificate signed by the CA; the public ``Inference`` server
asks for none, and neither does the proxy's HTTP front door, served over TLS with the
same certificate (:meth:`TLSConfig.server_ssl_context`). A servicer learns who called from the certificate's common name
(:func:`peer_common_name`): ``agent``, ``proxy``, ``admin``, … as issued by
:mod:`ferry.tlsgen` for the demo.
"""

from __future__ import annotations

import argparse
import dataclasses
import ssl
import tempfile
from pathlib import Path
from typing import Any

import grpc

from ferry.errors import ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class TLSConfig:
    """PEM bytes of the CA that signs every peer, and of this component's certificate and key."""

    ca: bytes
    cert: bytes
    key: bytes

    @classmethod
    def load(cls, ca: str | Path, cert: str | Path, key: str | Path) -> TLSConfig:
        def read(path: str | Path, flag: str) -> bytes:
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise ConfigError(flag, f"cannot read {path}: {exc.strerror}") from exc
        return cls(ca=read(ca, "--tls-ca"), cert=read(cert, "--tls-cert"), key=read(key, "--tls-key"))

    def server_credentials(self, *, require_client_cert: bool = True) -> grpc.ServerCredentials:
        """Server side: this certificate; peers verified against the CA (required when ``require_client_cert``)."""
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=require_client_cert)

    def server_ssl_context(self) -> ssl.SSLContext:
        """Server side for a plain TLS socket (the proxy's HTTP front door): this certificate, no client one asked.

        The PEM bytes pass through files in a private temporary directory (mode 0700) that is removed at once:
        ``ssl`` loads a certificate chain from paths only."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory(prefix="ferry-tls-") as private:
            cert, key = Path(private) / "cert.pem", Path(private) / "key.pem"
            cert.write_bytes(self.cert)
            key.touch(mode=0o600)
            key.write_bytes(self.key)
            context.load_cert_chain(cert, key)
        return context

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client side: verify the server against the CA and present this certificate."""
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--tls-ca``, ``--tls-cert``, ``--tls-key`` and ``--insecure``."""
    group = parser.add_argument_group("transport security")
    group.add_argument("--tls-ca", help="PEM file of the CA that signs every Ferry peer")
    group.add_argument("--tls-cert", help="PEM certificate of this component")
    group.add_argument("--tls-key", help="PEM private key of this component")
    group.add_argument("--insecure", action="store_true", help="plain text, no TLS (only on a trusted network)")


def from_args(args: argparse.Namespace, *, required: bool = True) -> TLSConfig | None:
    """The TLS config the flags give; None for ``--insecure``. Without either, ConfigError when ``required``."""
    files = (args.tls_ca, args.tls_cert, args.tls_key)
    if args.insecure:
        if any(files):
            raise ConfigError("--insecure", "give either --insecure or the --tls-* files, not both")
        return None
    if all(files):
        return TLSConfig.load(*files)
    if any(files) or required:
        raise ConfigError("--tls-cert", "give --tls-ca, --tls-cert and --tls-key together, or --insecure for "
                                        "plain text")
    return None


def channel(address: str, tls: TLSConfig | None, options: list[tuple[str, Any]] | None = None) -> grpc.aio.Channel:
    """An asyncio channel to ``address``: mutual TLS with ``tls``, plain text with None."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, tls.channel_credentials(), options=options)


def peer_common_name(context: Any) -> str | None:
    """The common name of the client certificate of an RPC's peer, or None without TLS or a certificate."""
    auth = context.auth_context() or {}
    names = auth.get("x509_common_name") or []
    return names[0].decode() if names else None
