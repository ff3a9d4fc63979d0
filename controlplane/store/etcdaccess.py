"""How the etcd store reaches etcd: its endpoints, client TLS and user, and the one channel helper.

:class:`EtcdAccess` holds what ``--store etcd://h1:2379,h2:2379`` and the
``[controlplane]`` keys ``store_tls_ca``, ``store_tls_cert``,
``store_tls_key`` (all three or none), ``store_user`` and
``store_password_file`` (or the environment variable ``FERRY_ETCD_PASSWORD``)
say; :func:`load_access` checks them, refusing a bad value with a
ConfigError naming its key. :func:`open_channel` is the one place a channel
to etcd is made (the store's own and the lease keeper's, on its thread):
``grpc.aio.secure_channel`` with the client certificate when TLS is set, else
a plain-text one; with a user, :class:`TokenAuth` rides on the channel as an
interceptor.

Token algorithm (:class:`TokenAuth`): before the first call, one
``Auth.Authenticate(user, password)`` (serialised by a lock, so calls that
start together share it); every call then carries the token as the ``token``
metadata. When etcd answers a unary call "invalid auth token" (the token
expired, or auth was switched off and on), the token is dropped,
``Authenticate`` runs again and the call is sent once more; a stream that
ends with that answer drops the token, so the next stream or call
authenticates again. While etcd has authentication off (``Authenticate``
answers "authentication is not enabled") calls go without a token; when it
is turned on, the first call refused ("user name is empty", or "permission
denied" for the client certificate's name, which etcd takes for the user of
a call without a token) authenticates and is sent once more, the same way. A refused password
raises ``UNAUTHENTICATED`` naming the user and etcd's reason. Cost: one extra round trip per token, none per call.

Endpoints (:class:`Endpoints`): the channel goes to one endpoint at a time;
:meth:`Endpoints.rotate` moves to the next one (the store calls it after a
connectivity failure), round robin, so with N endpoints a dead one costs one
failed call before the next is tried.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
from aetcd import rpc as etcd

from ferry.errors import ConfigError
from ferry.grpcutil import split_address
from ferry.tls import TLSConfig

PASSWORD_ENV = "FERRY_ETCD_PASSWORD"
INVALID_TOKEN = "invalid auth token"
NO_TOKEN = "user name is empty"  # etcd's answer to a call without a token while authentication is on
AUTH_OFF = "authentication is not enabled"  # its answer to Authenticate while it is off
NO_AUTH = "\x00auth-off"  # the token state "etcd has authentication off: send none"
AUTHENTICATE = "/etcdserverpb.Auth/Authenticate"
MAX_ENDPOINTS = 16


def parse_endpoints(url: str) -> tuple[str, ...]:
    """``etcd://h1:p1,h2:p2`` (or ``h1:p1,...``) to ``("h1:p1", "h2:p2")``; ValueError naming the bad one."""
    listed = url.removeprefix("etcd://").rstrip("/")
    endpoints = tuple(e.strip() for e in listed.split(","))
    if len(endpoints) > MAX_ENDPOINTS:
        raise ValueError(f"{len(endpoints)} endpoints (at most {MAX_ENDPOINTS})")
    for endpoint in endpoints:
        try:
            split_address(endpoint)
        except ValueError as exc:
            raise ValueError(f"endpoint {endpoint!r}: {exc}") from exc
    if len(set(endpoints)) != len(endpoints):
        raise ValueError("an endpoint is listed twice")
    return endpoints


@dataclasses.dataclass(frozen=True)
class EtcdAccess:
    """Client TLS (``tls``: CA, certificate and key) and user (``user``, ``password``) for etcd; empty: none."""

    tls: TLSConfig | None = None
    user: str = ""
    password: str = dataclasses.field(default="", repr=False)


def load_access(*, tls_ca: str, tls_cert: str, tls_key: str, user: str, password_file: str,
                env: Mapping[str, str] = os.environ) -> EtcdAccess:
    """The access the ``controlplane.store_*`` keys describe; ConfigError naming the key at fault."""
    files = {"store_tls_ca": tls_ca, "store_tls_cert": tls_cert, "store_tls_key": tls_key}
    given = [key for key, path in files.items() if path]
    tls = None
    if given and len(given) != 3:
        missing = sorted(set(files) - set(given))[0]
        raise ConfigError(f"controlplane.{missing}", "store_tls_ca, store_tls_cert and store_tls_key go together")
    if given:
        tls = TLSConfig(ca=_read(files["store_tls_ca"], "store_tls_ca"),
                        cert=_read(files["store_tls_cert"], "store_tls_cert"),
                        key=_read(files["store_tls_key"], "store_tls_key"))
    password = env.get(PASSWORD_ENV, "")
    if password_file:
        password = _read(password_file, "store_password_file").decode().strip()
    if password and not user:
        raise ConfigError("controlplane.store_user", "a store password is set but no store_user")
    if user and not password:
        raise ConfigError("controlplane.store_password_file",
                          f"store_user {user!r} needs a password (this file, or {PASSWORD_ENV})")
    if len(user) > 256 or any(c.isspace() for c in user):
        raise ConfigError("controlplane.store_user", "must be at most 256 characters, without spaces")
    return EtcdAccess(tls=tls, user=user, password=password)


def _read(path: str, key: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"controlplane.{key}", f"cannot read {path}: {exc.strerror}") from exc
    if not data.strip():
        raise ConfigError(f"controlplane.{key}", f"{path} is empty")
    return data


class Endpoints:
    """The endpoints of one etcd cluster and the one the channel goes to now (``current``)."""

    def __init__(self, endpoints: tuple[str, ...]) -> None:
        self.all = endpoints
        self._index = 0

    @property
    def current(self) -> str:
        return self.all[self._index]

    def rotate(self) -> bool:
        """Move to the next endpoint (round robin); whether there was another one to move to."""
        if len(self.all) < 2:
            return False
        self._index = (self._index + 1) % len(self.all)
        return True


def _refused_for_token(details: str, token: str) -> bool:
    """Whether etcd refused a call for its token: expired or invalidated, or none sent (``NO_AUTH``) while
    authentication is on again (refused as no user, or as the client certificate's name, which etcd takes
    for the user when a call has no token)."""
    if token == NO_AUTH:
        return NO_TOKEN in details or "permission denied" in details
    return INVALID_TOKEN in details


def _method(details: grpc.aio.ClientCallDetails) -> str:
    method = details.method
    return method.decode() if isinstance(method, bytes) else str(method)


class TokenAuth:
    """etcd's simple-token authentication on one channel (see the module docstring).

    Parameters: ``user``, ``password``, ``timeout`` (seconds an ``Authenticate`` call may take).
    Set :attr:`channel` once the channel exists (``open_channel`` does). ``authentications`` counts them.
    The channel's interceptors (:class:`UnaryToken`, :class:`StreamToken`) call :meth:`unary` and :meth:`stream`.
    """

    def __init__(self, user: str, password: str, *, timeout: float) -> None:
        self.user = user
        self._password = password
        self._timeout = timeout
        self.channel: grpc.aio.Channel | None = None
        self.token = ""
        self.authentications = 0
        self._lock: asyncio.Lock | None = None
        self._watchers: set[asyncio.Task[None]] = set()

    async def _token(self, stale: str = "") -> str:
        """The current token, authenticating first when there is none (or it is ``stale``)."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.token and self.token != stale:
                return self.token
            assert self.channel is not None
            request = etcd.AuthenticateRequest(name=self.user, password=self._password)
            try:
                response = await etcd.AuthStub(self.channel).Authenticate(request, timeout=self._timeout)
            except grpc.aio.AioRpcError as exc:
                if AUTH_OFF in (exc.details() or ""):
                    self.token = NO_AUTH
                    return self.token
                if exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED,
                                  grpc.StatusCode.FAILED_PRECONDITION):
                    raise grpc.aio.AioRpcError(
                        grpc.StatusCode.UNAUTHENTICATED, grpc.aio.Metadata(), grpc.aio.Metadata(),
                        details=f"user {self.user!r} not authenticated: {exc.details()}") from exc
                raise
            self.authentications += 1
            self.token = str(response.token)
            return self.token

    def _with(self, details: grpc.aio.ClientCallDetails, token: str) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*[(k, v) for k, v in (details.metadata or ()) if k != "token"])
        if token != NO_AUTH:
            metadata.add("token", token)
        return grpc.aio.ClientCallDetails(details.method, details.timeout, metadata, details.credentials,
                                          details.wait_for_ready)

    async def unary(self, continuation: Callable[..., Awaitable[Any]],
                    client_call_details: grpc.aio.ClientCallDetails, request: Any) -> Any:
        """Send with the token; refused for it (:func:`_refused_for_token`), authenticate again, send once more."""
        if _method(client_call_details) == AUTHENTICATE:
            return await continuation(client_call_details, request)
        token = await self._token()
        call = await continuation(self._with(client_call_details, token), request)
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            if not _refused_for_token(exc.details() or "", token):
                return call
            token = await self._token(stale=token)
            return await continuation(self._with(client_call_details, token), request)
        return call

    async def stream(self, continuation: Callable[..., Awaitable[Any]],
                     client_call_details: grpc.aio.ClientCallDetails, request_iterator: Any) -> Any:
        """Open the stream with the token; a stream refused for its token drops it for the next one."""
        token = await self._token()
        call = await continuation(self._with(client_call_details, token), request_iterator)
        watcher = asyncio.get_running_loop().create_task(self._after(call, token))
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)
        return call

    async def _after(self, call: Any, token: str) -> None:
        try:
            code, details = await call.code(), await call.details()
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            return
        if code != grpc.StatusCode.OK and _refused_for_token(details or "", token) and self.token == token:
            self.token = ""


class UnaryToken(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """The unary calls' side of a :class:`TokenAuth` (grpc.aio takes one interceptor class per call kind)."""

    def __init__(self, auth: TokenAuth) -> None:
        self.auth = auth

    async def intercept_unary_unary(self, continuation: Callable[..., Awaitable[Any]],
                                    client_call_details: grpc.aio.ClientCallDetails, request: Any) -> Any:
        return await self.auth.unary(continuation, client_call_details, request)


class StreamToken(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    """The streams' side of a :class:`TokenAuth`."""

    def __init__(self, auth: TokenAuth) -> None:
        self.auth = auth

    async def intercept_stream_stream(self, continuation: Callable[..., Awaitable[Any]],
                                      client_call_details: grpc.aio.ClientCallDetails,
                                      request_iterator: Any) -> Any:
        return await self.auth.stream(continuation, client_call_details, request_iterator)


def open_channel(endpoint: str, access: EtcdAccess, options: list[tuple[str, Any]],
                 *, timeout: float) -> grpc.aio.Channel:
    """A channel to ``endpoint``: TLS with the client certificate when ``access.tls``, with a token when a user."""
    interceptors: list[Any] = []
    auth = None
    if access.user:
        auth = TokenAuth(access.user, access.password, timeout=timeout)
        interceptors += [UnaryToken(auth), StreamToken(auth)]
    if access.tls is not None:
        channel = grpc.aio.secure_channel(endpoint, access.tls.channel_credentials(), options=options,
                                          interceptors=interceptors)
    else:
        channel = grpc.aio.insecure_channel(endpoint, options=options, interceptors=interceptors)
    if auth is not None:
        auth.channel = channel
    return channel
