"""The admin token: every call of the ``ferry.v1.Admin`` service must carry it.

A caller sends ``authorization: Bearer TOKEN`` in its metadata (``ferryctl
--admin-token``, env ``FERRY_ADMIN_TOKEN``, or the ``admin_token`` of the
ready file of ``ferry up``). The control plane keeps only the token's sha256
for checking (compared in constant time) and takes it, first found, from:

1. ``--admin-token-file PATH``: a file holding the token (whitespace stripped);
2. env ``FERRY_ADMIN_TOKEN``: the token;
3. config ``[controlplane] admin_token_sha256``: its sha256 in hex only.

When 1 or 2 and 3 are all given they must agree (``ConfigError`` naming the
key otherwise). A control plane with no token refuses every Admin call
(closed by default). Between control planes, a follower presents the same
token on ``Admin.Follow``, so with several control planes each needs the
token itself (1 or 2), not only its hash. Over mutual TLS a client
certificate of common name ``admin`` (:data:`ADMIN_CN`) needs no token.

:class:`AdminAuthInterceptor` wraps the handlers of the Admin service (and
only those) so that **each call** is checked: the decode guard before it
caches one handler per method, so the check must live inside the handler,
not in the interception. A refused call ends with UNAUTHENTICATED and a
message saying how to pass the token (:data:`HOW`). Cost per call: one sha256
of the presented token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from controlplane.api.status import abort
from ferry.decodeguard import relay
from ferry.errors import ConfigError, Unauthenticated
from ferry.tls import peer_common_name

ADMIN_PREFIX = "/ferry.v1.Admin/"
ENV = "FERRY_ADMIN_TOKEN"
ADMIN_CN = "admin"  # with mutual TLS, a client certificate of this common name needs no token
HOW = ("pass the admin token: ferryctl --admin-token TOKEN, or env FERRY_ADMIN_TOKEN, or ferryctl --ready-file "
       "READY.json of ferry up (its admin_token); it travels as metadata 'authorization: Bearer TOKEN'")


def sha256_hex(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class AdminAuth:
    """The sha256 to check against ("": no token, every Admin call refused), and the token when known."""

    sha256: str = ""
    token: str | None = field(default=None, repr=False)

    @classmethod
    def with_token(cls, token: str) -> AdminAuth:
        return cls(sha256_hex(token), token)

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What this control plane sends to the leader (nothing when it only knows the hash)."""
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def refusal(self, metadata: Sequence[tuple[str, Any]] | None) -> str | None:
        """None when ``metadata`` carries the token; else why the call is refused."""
        if not self.sha256:
            return ("the Admin API is closed: this control plane has no admin token (start it with "
                    "--admin-token-file, env FERRY_ADMIN_TOKEN or [controlplane] admin_token_sha256)")
        values = [str(v) for k, v in (metadata or ()) if k == "authorization"]
        if not values:
            return f"admin token required: {HOW}"
        scheme, _, token = values[0].partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return f"authorization metadata must be 'Bearer TOKEN': {HOW}"
        if not hmac.compare_digest(sha256_hex(token.strip()), self.sha256):
            return f"admin token not accepted: {HOW}"
        return None


def read_token_file(flag: str, path: str) -> str:
    """The stripped token in ``path`` (given by ``flag``); ConfigError naming ``flag`` when unreadable or empty."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(flag, f"cannot read {path}: {exc.strerror}") from exc
    if not token:
        raise ConfigError(flag, f"{path} is empty")
    return token


def load(config_sha256: str, token_file: str | None, env: Mapping[str, str] = os.environ) -> AdminAuth:
    """The token from the flag's file, the environment or the config (see the module doc)."""
    token: str | None = None
    if token_file:
        token = read_token_file("--admin-token-file", token_file)
    elif env.get(ENV, "").strip():
        token = env[ENV].strip()
    wanted = config_sha256.strip().lower()
    if wanted and (len(wanted) != 64 or any(c not in "0123456789abcdef" for c in wanted)):
        raise ConfigError("controlplane.admin_token_sha256", "must be a sha256 in hex (64 characters)")
    if token is None:
        return AdminAuth(wanted)
    if wanted and sha256_hex(token) != wanted:
        raise ConfigError("controlplane.admin_token_sha256", "does not match the token of --admin-token-file or "
                                                             f"{ENV}")
    return AdminAuth.with_token(token)


def _wrap(handler: grpc.RpcMethodHandler, auth: AdminAuth, refused: Callable[[], None]) -> grpc.RpcMethodHandler:
    async def check(context: grpc.aio.ServicerContext) -> None:
        if peer_common_name(context) == ADMIN_CN:  # mutual TLS: the operator's client certificate
            return
        reason = auth.refusal(context.invocation_metadata())
        if reason is not None:
            refused()
            await abort(context, Unauthenticated(reason))

    deser, ser = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary:
        inner_uu = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            await check(context)
            return await inner_uu(request, context)
        return grpc.unary_unary_rpc_method_handler(unary_unary, request_deserializer=deser, response_serializer=ser)
    if handler.stream_stream:
        inner_ss = handler.stream_stream

        async def stream_stream(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await check(context)
            async for item in relay(inner_ss(requests, context)):
                yield item
        return grpc.stream_stream_rpc_method_handler(stream_stream, request_deserializer=deser, response_serializer=ser)
    if handler.unary_stream:  # ExportTraffic (controlplane.api.traffic)
        inner_us = handler.unary_stream

        async def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await check(context)
            async for item in relay(inner_us(request, context)):
                yield item
        return grpc.unary_stream_rpc_method_handler(unary_stream, request_deserializer=deser, response_serializer=ser)
    raise TypeError("the Admin service has no client-streaming method")


class AdminAuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Server interceptor: every ``ferry.v1.Admin`` call must carry the admin token."""

    def __init__(self, auth: AdminAuth, refused: Callable[[], None] = lambda: None) -> None:
        self._auth = auth
        self._refused = refused

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or not details.method.startswith(ADMIN_PREFIX):
            return handler
        return _wrap(handler, self._auth, self._refused)
