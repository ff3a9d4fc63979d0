"""ferryctl's connection to the Admin API: the client, and where its address, token and TLS come from.

:class:`AdminClient` is an ``Admin`` stub whose every call carries the admin
token (``authorization: Bearer TOKEN``, :func:`admin_metadata`); ``ferry up``,
the benchmarks and the drills use it too. The rest reads a command's
connection options: :func:`addresses` (``--control-plane`` as a
comma-separated list, else the control planes of ``--ready-file``, else env
``FERRY_CONTROL_PLANE``), :func:`token` (``--admin-token``, else the ready
file's, else env :data:`TOKEN_ENV`), :func:`credentials` (``--tls-*``, else
the ready file's ``tls`` section, else plain text), :func:`reachable`
(whether a control plane accepts a connection within
:data:`CONNECT_TIMEOUT`) and :func:`connector` (an Admin client of another
control plane with the same credentials: the leader, or every member for
``status``). A bad option raises :class:`~ferry_cli.ctl.errors.UsageError`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from ferry.process import read_ready_file
from ferry.v1 import admin_pb2_grpc
from ferry_cli import clienttls
from ferry_cli.ctl.errors import UsageError

TIMEOUT = 5.0
CONNECT_TIMEOUT = 2.0  # seconds to wait for a control plane to accept a connection before trying the next
TOKEN_ENV = "FERRY_ADMIN_TOKEN"


def admin_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata that carries the admin token."""
    return (("authorization", f"Bearer {token}"),) if token else ()


class AdminClient:
    """An ``Admin`` stub whose every call carries the admin token."""

    def __init__(self, channel: grpc.Channel, token: str | None) -> None:
        self._stub = admin_pb2_grpc.AdminStub(channel)
        self._metadata = admin_metadata(token)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return functools.partial(getattr(self._stub, name), metadata=self._metadata)


def ready(args: argparse.Namespace) -> dict[str, Any]:
    """The ready file of ``--ready-file`` (empty without one, or before ``ferry up`` wrote it)."""
    return (read_ready_file(args.ready_file) or {}) if args.ready_file else {}


def addresses(args: argparse.Namespace) -> list[str]:
    """The control planes to try, in order: ``--control-plane`` (comma-separated), the ready file's, the env's."""
    info = ready(args)
    given: Any = (args.control_plane or info.get("control_planes") or info.get("control_plane")
                  or os.environ.get("FERRY_CONTROL_PLANE"))
    items = given.split(",") if isinstance(given, str) else [str(a) for a in given or ()]
    found = list(dict.fromkeys(a.strip() for a in items if a.strip()))
    if not found:
        raise UsageError("give --control-plane host:port[,host:port...], --ready-file, or set FERRY_CONTROL_PLANE")
    return found


def reachable(channel: grpc.Channel) -> bool:
    """Whether the channel's control plane accepts a connection within :data:`CONNECT_TIMEOUT`."""
    try:
        grpc.channel_ready_future(channel).result(timeout=CONNECT_TIMEOUT)
    except grpc.FutureTimeoutError:
        return False
    return True


def credentials(args: argparse.Namespace) -> grpc.ChannelCredentials | None:
    """The channel credentials of ``--tls-ca``/``--tls-cert``/``--tls-key`` or the ready file; None: plain text."""
    try:
        return clienttls.credentials(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key, ready=ready(args))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def token(args: argparse.Namespace) -> str | None:
    """The admin token: ``--admin-token``, the ready file's, env :data:`TOKEN_ENV`; None: none given."""
    found = args.admin_token or ready(args).get("admin_token") or os.environ.get(TOKEN_ENV)
    return str(found) if found else None


@contextlib.contextmanager
def at(args: argparse.Namespace, address: str) -> Iterator[AdminClient]:
    """An Admin client of the control plane at ``address``, with the same credentials and token."""
    with clienttls.sync_channel(address, credentials(args)) as channel:
        yield AdminClient(channel, token(args))


def connector(args: argparse.Namespace) -> Callable[[str], contextlib.AbstractContextManager[AdminClient]]:
    """:func:`at` bound to ``args``: what the commands that ask another control plane are given."""
    return functools.partial(at, args)
