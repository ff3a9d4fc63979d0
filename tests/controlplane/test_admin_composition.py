"""The Admin servicer is composed from the concerns' handlers: every RPC served once, bound as the handler has it."""

from __future__ import annotations

from typing import Any

import pytest

from controlplane.api.servicers import AdminServicer
from ferry.v1 import admin_pb2


def handler(*names: str) -> object:
    async def rpc(request: Any, context: Any) -> str:
        return "served"
    return type("Rpcs", (), {name: staticmethod(rpc) for name in names})()


ALL = [m.name for m in admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods]


async def test_each_rpc_is_the_handlers_own_method() -> None:
    first, rest = handler(*ALL[:3]), handler(*ALL[3:])
    admin = AdminServicer(first, rest)
    assert await getattr(admin, ALL[0])(None, None) == "served"
    assert set(admin.owners) == set(ALL)


def test_a_missing_handler_is_refused_naming_the_rpc() -> None:
    with pytest.raises(ValueError, match=ALL[-1]):
        AdminServicer(handler(*ALL[:-1]))


def test_two_handlers_for_one_rpc_are_refused() -> None:
    with pytest.raises(ValueError, match=f"Admin.{ALL[0]}: served by both"):
        AdminServicer(handler(*ALL), handler(ALL[0]))
