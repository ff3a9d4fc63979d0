"""Transport security for Ferry's channels: mutual TLS inside, TLS on the public API.

Every component takes ``--tls-ca``, ``--tls-cert`` and ``--tls-key`` (PEM files)
or an explicit ``--insecure`` for plain text (:func:`add_arguments`,
:func:`from_args`). Internal servers (control plane, replicas behind the agent)
require a client certificate signed by the CA; the public ``Inference`` server
asks for none, and neither does the proxy's HTTP front door, served over TLS with the
same certificate (:meth:`TLSConfig.server_ssl_context`). A servicer learns who called from the certificate's common name
(:func:`peer_common_name`): ``agent``, ``proxy``, ``admin``, … as issued by
:mod:`harness.tlsgen` for the demo.

Rotation without a restart, one mechanism for both sides: a config read from
files (:meth:`TLSConfig.load`) holds a :class:`CertificateFiles`, which looks
at the files (one ``stat`` each: inode, modification time, size, so that a
Kubernetes Secret's atomic ``..data`` symlink swap is seen) at most every
``--tls-reload-seconds`` (default :data:`RELOAD_SECONDS`) when asked, and when
they changed reads the three and checks them (the CA parses, the key matches
the certificate) before they become current, bumping a generation number. A
read that does not check (a key written before its certificate, a truncated
file) keeps the last good pair: it is logged and counted once
(``ferry_tls_reload_total{outcome="rejected"}``) and tried again when the
files change again; a good one counts ``outcome="reloaded"``.

- Servers: gRPC's dynamic credentials (``grpc.dynamic_ssl_server_credentials``),
  whose fetcher gRPC calls at each new connection's handshake, looks at once
  (no interval). Connections already open keep the certificate they shook
  hands with. The HTTP front door's context is reloaded by its owner (the
  proxy) every interval (:meth:`CertificateFiles.follow`).
- Clients: :meth:`TLSConfig.channel_credentials` always gives the current
  pair, so every channel opened later (each reconnection of the agent's and
  the proxy's control-plane streams) presents it. A long-lived channel is held
  in a :class:`Renewing`, rebuilt at its first use after the generation moved:
  calls already on the old channel finish there, and it is closed when the
  last of them ends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import grpc
from prometheus_client import Counter

from ferry.errors import ConfigError
from ferry.metrics import name

log = logging.getLogger("ferry.tls")

RELOAD_SECONDS = 5.0  # default of --tls-reload-seconds: how often certificate files are looked at, at most
MAX_RELOAD_SECONDS = 3600.0

RELOADS = Counter(name("tls_reload"), "Certificate files read again after they changed, by outcome: reloaded "
                  "(the new pair is in use) or rejected (it did not load; the last good pair stays)", ["outcome"])
for _outcome in ("reloaded", "rejected"):
    RELOADS.labels(outcome=_outcome)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TLSConfig:
    """PEM bytes of the CA that signs every peer, and of this component's certificate and key.

    Read from files (:meth:`load`), it also holds their :class:`CertificateFiles` (``watch``): :meth:`current`
    is then the last good read of the files, which may be newer than ``ca``, ``cert`` and ``key`` (those read
    at start)."""

    ca: bytes
    cert: bytes
    key: bytes
    files: tuple[Path, Path, Path] | None = dataclasses.field(default=None, compare=False)  # ca, cert, key
    watch: CertificateFiles | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def load(cls, ca: str | Path, cert: str | Path, key: str | Path, *, reload_seconds: float = RELOAD_SECONDS,
             clock: Callable[[], float] = time.monotonic) -> TLSConfig:
        """The files' contents, followed afterwards every ``reload_seconds`` at most (``clock``: monotonic)."""
        def read(path: str | Path, flag: str) -> bytes:
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise ConfigError(flag, f"cannot read {path}: {exc.strerror}") from exc
        paths = (Path(ca), Path(cert), Path(key))
        loaded = cls(ca=read(ca, "--tls-ca"), cert=read(cert, "--tls-cert"), key=read(key, "--tls-key"), files=paths)
        watch = CertificateFiles(*paths, loaded=loaded, interval=reload_seconds, clock=clock)
        return dataclasses.replace(loaded, watch=watch)

    def current(self) -> TLSConfig:
        """The pair to use now: the files' last good read (looked at when the last look is an interval old)."""
        return self if self.watch is None else self.watch.snapshot()[1]

    def generation(self) -> int:
        """How many times the files changed to a good pair since start (0 when not read from files)."""
        return 0 if self.watch is None else self.watch.snapshot()[0]

    def check(self) -> None:
        """Raise ssl.SSLError or ValueError unless the CA parses and the key matches the certificate."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_verify_locations(cadata=self.ca.decode("ascii"))
        self.load_into(context)

    def load_into(self, context: ssl.SSLContext) -> None:
        """Load this certificate and key into ``context`` (new connections get them).

        The PEM bytes pass through files in a private temporary directory (mode 0700) that is removed at once:
        ``ssl`` loads a certificate chain from paths only."""
        with tempfile.TemporaryDirectory(prefix="ferry-tls-") as private:
            cert, key = Path(private) / "cert.pem", Path(private) / "key.pem"
            cert.write_bytes(self.cert)
            key.touch(mode=0o600)
            key.write_bytes(self.key)
            context.load_cert_chain(cert, key)

    def server_credentials(self, *, require_client_cert: bool = True) -> grpc.ServerCredentials:
        """Server side: this certificate; peers verified against the CA (required when ``require_client_cert``).

        Read from files, the credentials follow them (see the module): a rotated certificate is served to new
        connections without a restart."""
        if self.watch is not None:
            fetcher = _ServerFetcher(self.watch)
            return grpc.dynamic_ssl_server_credentials(fetcher.initial, fetcher.fetch,
                                                       require_client_authentication=require_client_cert)
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=require_client_cert)

    def server_ssl_context(self) -> ssl.SSLContext:
        """Server side for a plain TLS socket (the proxy's HTTP front door): the current pair, no client one asked.

        Its owner reloads a rotated certificate into it with :meth:`CertificateFiles.follow`."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.current().load_into(context)
        return context

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Client side: verify the server against the CA and present this certificate (the current pair)."""
        now = self.current()
        return grpc.ssl_channel_credentials(root_certificates=now.ca, private_key=now.key,
                                            certificate_chain=now.cert)


Stamp = tuple[tuple[int, int, int], ...]
MISSING: Stamp = ()  # the stamp of files of which one cannot be looked at


class CertificateFiles:
    """The CA, certificate and key files of a component, read again when they change (see the module docstring).

    Algorithm: :meth:`snapshot` looks at the files when its last look is older than ``max_age`` (default
    ``interval`` seconds, by ``clock``); a look takes their stamp (inode, modification time in ns and size of
    each, after symlinks) and, when it differs from the last good read's and from the last rejected one's,
    reads and checks them (:meth:`TLSConfig.check`). A good read with new bytes becomes ``current`` and bumps
    ``generation``; the same bytes only take the new stamp. Thread-safe (gRPC calls a server's fetcher from its
    own threads). Cost per look: three ``stat`` calls; per change: three reads and one TLS load.
    """

    def __init__(self, ca: Path, cert: Path, key: Path, *, loaded: TLSConfig, interval: float = RELOAD_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 <= interval <= MAX_RELOAD_SECONDS:
            raise ValueError(f"interval must be within [0, {MAX_RELOAD_SECONDS:g}] seconds, not {interval}")
        self.paths = (ca, cert, key)
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._stamp = self.stamp()  # of the last good read (taken now: the first look changes nothing)
        self._rejected: Stamp | None = None  # of the last read that did not check
        self._looked = clock()
        self.current = loaded
        self.generation = 0

    def stamp(self) -> Stamp:
        """Each file's (inode, mtime in ns, size), or MISSING when one cannot be looked at."""
        try:
            return tuple((st.st_ino, st.st_mtime_ns, st.st_size) for st in (os.stat(p) for p in self.paths))
        except OSError:
            return MISSING

    def snapshot(self, max_age: float | None = None) -> tuple[int, TLSConfig]:
        """(generation, config) of the last good read, after a look when the last one is ``max_age`` old."""
        with self._lock:
            now = self._clock()
            if now - self._looked >= (self.interval if max_age is None else max_age):
                self._looked = now
                self._look()
            return self.generation, self.current

    def _look(self) -> None:
        stamp = self.stamp()
        if stamp == self._stamp or stamp == self._rejected:
            return
        ca, cert, key = self.paths
        try:
            if stamp == MISSING:
                raise OSError("a file is missing")
            fresh = TLSConfig(ca=ca.read_bytes(), cert=cert.read_bytes(), key=key.read_bytes())
            fresh.check()
        except (OSError, ValueError, ssl.SSLError) as exc:
            self._rejected = stamp
            RELOADS.labels(outcome="rejected").inc()
            log.warning("certificate files %s changed but do not load (%s); keeping the last good ones until they "
                        "change again", cert, exc)
            return
        self._stamp, self._rejected = stamp, None
        if fresh == self.current:
            return
        self.current = fresh
        self.generation += 1
        RELOADS.labels(outcome="reloaded").inc()
        log.info("certificate reloaded from %s (generation %d)", cert, self.generation)

    def reload(self, context: ssl.SSLContext, loaded: int) -> int:
        """Load the current pair into ``context`` when its generation is past ``loaded``; the generation it holds."""
        generation, fresh = self.snapshot()
        if generation != loaded:
            fresh.load_into(context)
        return generation

    async def follow(self, context: ssl.SSLContext, loaded: int, stop: asyncio.Event) -> None:
        """Until ``stop``: :meth:`reload` ``context`` (holding generation ``loaded``) every interval (>= 0.05 s)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(self.interval, 0.05))
            loaded = self.reload(context, loaded)


def _server_configuration(tls: TLSConfig) -> Any:
    return grpc.ssl_server_certificate_configuration([(tls.key, tls.cert)], root_certificates=tls.ca)


class _ServerFetcher:
    """gRPC's certificate configuration fetcher for a server: looks at the files at each handshake."""

    def __init__(self, watch: CertificateFiles) -> None:
        self._watch = watch
        self._given, current = watch.snapshot()
        self.initial = _server_configuration(current)

    def fetch(self) -> Any:
        """A new configuration when the generation moved since the last one given to gRPC, else None (keep it)."""
        generation, current = self._watch.snapshot(max_age=0.0)
        if generation == self._given:
            return None
        self._given = generation
        return _server_configuration(current)


class Closable(Protocol):
    """What :class:`Renewing` holds: a client with an asynchronous ``close``."""

    async def close(self) -> None: ...


C = TypeVar("C", bound=Closable)


@dataclasses.dataclass
class _Held(Generic[C]):
    """A client of :class:`Renewing`, the generation it was built for, and the calls on it now."""

    client: C
    generation: int
    calls: int = 0


class Renewing(Generic[C]):
    """A long-lived client (a gRPC channel and what wraps it) that follows the certificates of ``tls``.

    ``make()`` builds a client (its credentials from :meth:`TLSConfig.channel_credentials`: the current pair).
    Each :meth:`use` asks ``tls.generation()`` (a look at the files at most every interval); when it moved,
    this call and the later ones get a new client, while the calls already on the old one finish there: the
    old one is closed when the last of them ends (at once when none runs). Without ``tls`` the client is
    built once. Cost per use: one lock, one clock read, an integer compare.
    """

    def __init__(self, make: Callable[[], C], tls: TLSConfig | None) -> None:
        self._make = make
        self._tls = tls
        self._held: _Held[C] | None = None

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[C]:
        """The current client for the duration of one call."""
        generation = self._tls.generation() if self._tls is not None else 0
        held = self._held
        if held is None or held.generation != generation:
            self._held = _Held(self._make(), generation)
            if held is not None and held.calls == 0:
                await held.client.close()
            held = self._held
        held.calls += 1
        try:
            yield held.client
        finally:
            held.calls -= 1
            if held is not self._held and held.calls == 0:
                await held.client.close()

    async def close(self) -> None:
        """Close the current client (a retired one still in use is closed by its last call)."""
        held, self._held = self._held, None
        if held is not None:
            await held.client.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--tls-ca``, ``--tls-cert``, ``--tls-key``, ``--insecure`` and ``--tls-reload-seconds``."""
    group = parser.add_argument_group("transport security")
    group.add_argument("--tls-ca", help="PEM file of the CA that signs every Ferry peer")
    group.add_argument("--tls-cert", help="PEM certificate of this component")
    group.add_argument("--tls-key", help="PEM private key of this component")
    group.add_argument("--insecure", action="store_true", help="plain text, no TLS (only on a trusted network)")
    group.add_argument("--tls-reload-seconds", type=float, default=RELOAD_SECONDS,
                       help="look at the --tls-* files at most this often; a renewed certificate is used from "
                            f"then on, without a restart (default {RELOAD_SECONDS:g})")


def from_args(args: argparse.Namespace, *, required: bool = True) -> TLSConfig | None:
    """The TLS config the flags give; None for ``--insecure``. Without either, ConfigError when ``required``."""
    files = (args.tls_ca, args.tls_cert, args.tls_key)
    if args.insecure:
        if any(files):
            raise ConfigError("--insecure", "give either --insecure or the --tls-* files, not both")
        return None
    if all(files):
        seconds = args.tls_reload_seconds
        if not 0 < seconds <= MAX_RELOAD_SECONDS:
            raise ConfigError("--tls-reload-seconds", f"must be within (0, {MAX_RELOAD_SECONDS:g}], not {seconds}")
        return TLSConfig.load(*files, reload_seconds=seconds)
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
