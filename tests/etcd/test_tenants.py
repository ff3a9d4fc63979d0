"""Tenants kept in etcd survive a control-plane restart; the proxy keeps serving them meanwhile.

The control plane is killed (SIGKILL) and started again on the same port:
what it knows of the tenants comes from etcd, and its config file's tenant,
already seeded, is not written again.
"""

from __future__ import annotations

import grpc

from ferry.config import hash_api_key
from ferry.v1 import admin_pb2, common_pb2, inference_pb2, inference_pb2_grpc
from tests.etcd.harness import etcd_keys, wait_for

KEY = "key-of-newco-0123456789"


def infer(address: str, key: str) -> grpc.StatusCode:
    request = inference_pb2.InferRequest(model="chat", prompt="a b c", max_tokens=2, tier=common_pb2.TIER_STANDARD)
    with grpc.insecure_channel(address) as channel:
        try:
            inference_pb2_grpc.InferenceStub(channel).Infer(request, metadata=(("x-api-key", key),), timeout=10)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def names(fleet: object) -> list[str]:
    channel, admin = fleet.admin(0)  # type: ignore[attr-defined]
    with channel:
        return [t.name for t in admin.ListTenants(admin_pb2.ListTenantsRequest(), timeout=5).tenants]


def test_tenants_survive_a_control_plane_restart(make_fleet, etcd) -> None:
    fleet = make_fleet({"node-a": ["chat:v1"]}, control_planes=1)
    proxy = fleet.proxies[0].ready["grpc"]
    assert names(fleet) == ["ent"]  # seeded from the config file
    channel, admin = fleet.admin(0)
    with channel:
        admin.PutTenant(admin_pb2.PutTenantRequest(tenant=admin_pb2.TenantView(name="newco", plan="paid"),
                                                   api_key=KEY), timeout=5)
        admin.DeleteTenant(admin_pb2.DeleteTenantRequest(name="ent"), timeout=5)
    wait_for(lambda: infer(proxy, KEY) == grpc.StatusCode.OK, 5, "the new tenant at the proxy")
    assert "/ferry/intent/tenant/newco" in etcd_keys(etcd, "/ferry/intent/tenant")
    fleet.cps[0].kill()
    assert infer(proxy, KEY) == grpc.StatusCode.OK  # no control plane: the last set applied
    assert infer(proxy, fleet.key) == grpc.StatusCode.UNAUTHENTICATED
    fleet.restart_cp(0)
    assert names(fleet) == ["newco"]  # from etcd; "ent" of the config file is not seeded again
    channel, admin = fleet.admin(0)
    with channel:
        view = admin.ListTenants(admin_pb2.ListTenantsRequest(), timeout=5).tenants[0]
    assert view.api_key_sha256 == hash_api_key(KEY)
    wait_for(lambda: infer(proxy, KEY) == grpc.StatusCode.OK, 10, "the proxy served by the restarted plane")
    assert infer(proxy, fleet.key) == grpc.StatusCode.UNAUTHENTICATED
