"""Transport security for Ferry's channels: mutual TLS inside, TLS on the public API.

Every component takes ``--tls-ca``, ``--tls-cert`` and ``--tls-key`` (PEM files)
or an explicit ``--insecure`` for plain text (:func:`add_arguments`,
:func:`from_args`). Internal servers (control plane, replicas behind the agent)
require a client certificate signed by the CA; the public ``Inference`` server
asks for none, and neither does the proxy's HTTP front door, served over TLS with the
same certificate (:meth:`TLSConfig.server_ssl_context`). A servicer learns who called from the certificate's common name
(:func:`peer_common_name`): ``agent``, ``proxy``, ``admin``, … as issued by
:mod:`ferry.tlsgen` for the demo.

Rotation without a restart: a config read from files (:meth:`TLSConfig.load`)
keeps their paths, and its server credentials are gRPC's dynamic ones
(``grpc.dynamic_ssl_server_credentials``) with :class:`CertificateFiles` as
the fetcher, which gRPC calls at each new connection's handshake: it looks
at the files' modification times and sizes (two ``stat`` calls) and, when
they changed, reads the CA, certificate and key again and hands gRPC the
new configuration; a pair that does not load (a key written before its
certificate, say) keeps the last good one until the files agree. Calls on
connections already open keep the certificate they shook hands with. The
HTTP front door's context is reloaded the same way by :meth:`CertificateFiles.reload`,
called by its owner (the proxy, every :data:`RELOAD_SECONDS`). Client sides
(a component's certificate towards its peers) are read once at start.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import ssl
import tempfile
from pathlib import Path
from typing import Any

import grpc

from ferry.errors import ConfigError

log = logging.getLogger("ferry.tls")

RELOAD_SECONDS = 5.0  # how often an owner of a TLS socket context looks at the files (CertificateFiles.reload)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TLSConfig:
    """PEM bytes of the CA that signs every peer, and of this component's certificate and key."""

    ca: bytes
    cert: bytes
    key: bytes
    files: tuple[Path, Path, Path] | None = dataclasses.field(default=None, compare=False)  # ca, cert, key

    @classmethod
    def load(cls, ca: str | Path, cert: str | Path, key: str | Path) -> TLSConfig:
        def read(path: str | Path, flag: str) -> bytes:
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise ConfigError(flag, f"cannot read {path}: {exc.strerror}") from exc
        return cls(ca=read(ca, "--tls-ca"), cert=read(cert, "--tls-cert"), key=read(key, "--tls-key"),
                   files=(Path(ca), Path(cert), Path(key)))

    def server_credentials(self, *, require_client_cert: bool = True) -> grpc.ServerCredentials:
        """Server side: this certificate; peers verified against the CA (required when ``require_client_cert``).

        Loaded from files, the credentials follow them (:class:`CertificateFiles`): a rotated certificate
        is served to new connections without a restart."""
        if self.files is not None:
            files = CertificateFiles(*self.files, loaded=self)
            return grpc.dynamic_ssl_server_credentials(files.configuration(self), files.fetch,
                                                       require_client_authentication=require_client_cert)
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=require_client_cert)

    def server_ssl_context(self) -> ssl.SSLContext:
        """Server side for a plain TLS socket (the proxy's HTTP front door): this certificate, no client one asked.

        The PEM bytes pass through files in a private temporary directory (mode 0700) that is removed at once:
        ``ssl`` loads a certificate chain from paths only. (Its owner reloads a rotated certificate with
        :meth:`CertificateFiles.reload`.)"""
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


Stamp = tuple[tuple[int, int], ...]


class CertificateFiles:
    """The CA, certificate and key files of a server, read again when they change (see the module docstring).

    ``loaded``: the config as read at start (its files' stamp is taken now, so that the first handshake
    changes nothing). State: the stamp (modification time and size of each file) of the last good read.
    """

    def __init__(self, ca: Path, cert: Path, key: Path, *, loaded: TLSConfig) -> None:
        self.paths = (ca, cert, key)
        self._stamp: Stamp | None = self.stamp()
        self.current = loaded

    def stamp(self) -> Stamp | None:
        """Each file's (mtime in ns, size), or None when one cannot be looked at."""
        try:
            return tuple((st.st_mtime_ns, st.st_size) for st in (os.stat(p) for p in self.paths))
        except OSError:
            return None

    @staticmethod
    def configuration(tls: TLSConfig) -> Any:
        """gRPC's server certificate configuration of ``tls``."""
        return grpc.ssl_server_certificate_configuration([(tls.key, tls.cert)], root_certificates=tls.ca)

    def changed(self) -> TLSConfig | None:
        """The files' new contents when they changed since the last good read and load as a pair, else None."""
        stamp = self.stamp()
        if stamp is None or stamp == self._stamp:
            return None
        ca, cert, key = self.paths
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)  # do they match?
            fresh = TLSConfig(ca=ca.read_bytes(), cert=cert.read_bytes(), key=key.read_bytes(), files=self.paths)
        except (OSError, ssl.SSLError) as exc:
            log.warning("certificate files changed but do not load (%s); serving the last good ones", exc)
            return None
        self._stamp = stamp
        self.current = fresh
        log.info("certificate reloaded from %s", cert)
        return fresh

    def fetch(self) -> Any:
        """gRPC's fetcher: a new configuration when the files changed, else None (keep the current one)."""
        fresh = self.changed()
        return None if fresh is None else self.configuration(fresh)

    def reload(self, context: ssl.SSLContext) -> bool:
        """Load the files into ``context`` (new connections get them) when they changed; whether it did."""
        if self.changed() is None:
            return False
        _, cert, key = self.paths
        try:
            context.load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:  # changed again since it was checked: the next look loads it
            log.warning("certificate files changed while being loaded (%s)", exc)
            self._stamp = None
            return False
        return True


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
