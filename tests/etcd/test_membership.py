"""Membership in etcd: a node killed with SIGKILL drops out of the store by its lease, and out of every table."""

from __future__ import annotations

import time

from tests.etcd.harness import TTL, etcd_keys, wait_for


def test_a_killed_node_drops_out_by_lease_and_leaves_every_table(make_fleet, etcd) -> None:
    fleet = make_fleet({"node-a": ["chat:v1"], "node-b": ["chat:v1"]}, control_planes=2, proxies=2)
    wait_for(lambda: etcd_keys(etcd, "/ferry/members/") == ["/ferry/members/node-a", "/ferry/members/node-b"], 5,
             "both members in etcd")
    wait_for(lambda: etcd_keys(etcd, "/ferry/tables/") == ["/ferry/tables/local"], 5, "the table's head in etcd")
    assert etcd_keys(etcd, "/ferry/controlplanes/") == ["/ferry/controlplanes/controlplane-1",
                                                        "/ferry/controlplanes/controlplane-2"]
    assert etcd_keys(etcd, "/ferry/election/") == ["/ferry/election/leader"]
    killed_at = time.monotonic()
    fleet.nodes["node-b"].kill()  # SIGKILL: its agent and replica die at once; held by controlplane-2
    wait_for(lambda: etcd_keys(etcd, "/ferry/members/") == ["/ferry/members/node-a"], TTL + 3,
             "node-b's key to expire with its lease")
    gone_after = time.monotonic() - killed_at
    print(f"node-b's membership expired {gone_after:.2f} s after SIGKILL (lease TTL {TTL:.0f} s)")
    for i in (0, 1):
        wait_for(lambda i=i: not getattr(fleet.replicas(i).get("node-b-r0"), "in_table", False), 5,
                 f"node-b-r0 to leave the table served by control plane {i + 1}")
        assert fleet.replicas(i)["node-a-r0"].in_table
