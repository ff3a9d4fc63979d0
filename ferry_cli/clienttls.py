"""Client-side TLS of the command-line tools: credentials from flags or from ``ferry up``'s ready file.

``ferry up --tls`` writes ``"tls": {"ca", "client_cert", "client_key"}`` into
its ready file (paths; the client certificate has common name ``admin``).
:func:`credentials` builds ``grpc.ChannelCredentials`` from explicit files
first, else from that section, else returns None (plain text).
:func:`sync_channel` opens a blocking channel with them. ``ferry call``
passes only the CA (the public API asks for no client certificate);
``ferryctl`` passes the client certificate too (mutual TLS to the control
plane, where common name ``admin`` opens the Admin API).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{what}: cannot read {path}: {exc.strerror}") from exc


def credentials(*, ca: str | None = None, cert: str | None = None, key: str | None = None,
                ready: Mapping[str, Any] | None = None, client_cert: bool = True) -> grpc.ChannelCredentials | None:
    """Channel credentials from the files given, else the ready file's ``tls`` section; None for plain text."""
    section = (ready or {}).get("tls") or {}
    ca = ca or section.get("ca")
    if client_cert:
        cert = cert or section.get("client_cert")
        key = key or section.get("client_key")
    if not ca:
        if cert or key:
            raise ValueError("--tls-ca is needed with --tls-cert and --tls-key")
        return None
    if bool(cert) != bool(key):
        raise ValueError("give --tls-cert and --tls-key together")
    root = _read(ca, "--tls-ca")
    if cert and key and client_cert:
        return grpc.ssl_channel_credentials(root_certificates=root, private_key=_read(key, "--tls-key"),
                                            certificate_chain=_read(cert, "--tls-cert"))
    return grpc.ssl_channel_credentials(root_certificates=root)


def sync_channel(address: str, creds: grpc.ChannelCredentials | None) -> grpc.Channel:
    """A blocking channel to ``address``: TLS with ``creds``, plain text with None."""
    return grpc.secure_channel(address, creds) if creds is not None else grpc.insecure_channel(address)
