"""``ferryctl tenants``: list, add, change and remove the tenants kept in the store.

Forms::

    ferryctl tenants [list]
    ferryctl tenants add NAME [--plan P] [--tiers a,b] [--rps N] [--tps N] [--concurrency N]
                              (--api-key K | --api-key-sha256 H | --generate-key)
    ferryctl tenants set NAME [--plan P] [--tiers a,b] [--rps N] [--tps N] [--concurrency N]
                              [--api-key K | --api-key-sha256 H | --generate-key]
    ferryctl tenants remove NAME

``add`` refuses a name that exists (ALREADY_EXISTS) and defaults to plan
``paid``, every tier and no limits; ``set`` changes only the options given
(NOT_FOUND for an unknown tenant). ``--generate-key`` makes a fresh key
(``fk_`` and 48 hex digits from :mod:`secrets`) and prints it once: the
control plane keeps only its sha256, and ``list`` shows only that. A key given
with ``--api-key`` travels to the control plane (over TLS in production),
which hashes it and never stores it. ``--json`` prints the same data as
objects (``list``: ``{"managed", "max_tenants", "tenants"}``).
"""

from __future__ import annotations

import argparse
import json
import secrets
from collections.abc import Callable
from typing import Any

from ferry.v1 import admin_pb2
from ferry_cli.ctl.errors import UsageError
from ferry_cli.ctl.views import print_table

HELP = "tenants kept in the store: list, add NAME, set NAME, remove NAME (API keys are stored as sha256)"
ACTIONS = ("list", "add", "set", "remove")
TIMEOUT = 10.0
KEY_HASH_SHOWN = 12  # characters of the key hash in the human table


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``ferryctl tenants`` on its subparser."""
    p.add_argument("action", nargs="?", default="list", choices=ACTIONS, help="default: list")
    p.add_argument("name", nargs="?", metavar="NAME", help="the tenant (add, set, remove)")
    p.add_argument("--plan", help="free, paid or enterprise (add: default paid)")
    p.add_argument("--tiers", help="comma-separated tiers it may use, e.g. interactive,standard (add: default all)")
    p.add_argument("--rps", type=float, help="requests per second per proxy (0: no limit)")
    p.add_argument("--tps", type=float, help="tokens (prompt + max tokens) per second per proxy (0: no limit)")
    p.add_argument("--concurrency", type=int, help="requests in flight per proxy (0: no limit)")
    keys = p.add_mutually_exclusive_group()
    keys.add_argument("--api-key", help="the API key (hashed by the control plane, never stored)")
    keys.add_argument("--api-key-sha256", help="the sha256 in hex of the API key")
    keys.add_argument("--generate-key", action="store_true", help="make a fresh API key and print it once")


def generate_key() -> str:
    return "fk_" + secrets.token_hex(24)


def tenant_row(t: admin_pb2.TenantView) -> dict[str, Any]:
    return {
        "name": t.name, "plan": t.plan, "tiers": list(t.tiers), "rps": t.requests_per_second,
        "tps": t.tokens_per_second, "concurrency": t.max_concurrency, "api_key_sha256": t.api_key_sha256,
        "updated_at": round(t.updated_at, 3),
    }


def _tiers(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def build_put(args: argparse.Namespace) -> tuple[admin_pb2.PutTenantRequest, str | None]:
    """The ``PutTenant`` request of ``add`` or ``set``, and the generated key (None unless --generate-key)."""
    if not args.name:
        raise UsageError(f"tenants {args.action}: give the tenant's NAME")
    view = admin_pb2.TenantView(name=args.name)
    request = admin_pb2.PutTenantRequest(create_only=args.action == "add")
    fields: list[str] = []
    if args.plan is not None:
        view.plan = args.plan
        fields.append("plan")
    if args.tiers is not None:
        view.tiers.extend(_tiers(args.tiers))
        fields.append("tiers")
    for option, field in (("rps", "requests_per_second"), ("tps", "tokens_per_second"),
                          ("concurrency", "max_concurrency")):
        value = getattr(args, option)
        if value is not None:
            setattr(view, field, value)
            fields.append(field)
    generated = generate_key() if args.generate_key else None
    key = generated or args.api_key
    if key:
        request.api_key = key
        fields.append("api_key_sha256")
    elif args.api_key_sha256:
        view.api_key_sha256 = args.api_key_sha256
        fields.append("api_key_sha256")
    if args.action == "add":
        if "api_key_sha256" not in fields:
            raise UsageError("tenants add: give --api-key, --api-key-sha256 or --generate-key")
    else:
        if not fields:
            raise UsageError("tenants set: give at least one of --plan, --tiers, --rps, --tps, --concurrency or a key")
        request.fields.extend(fields)
    request.tenant.CopyFrom(view)
    return request, generated


def emit(args: argparse.Namespace, data: Any, show: Callable[[], None]) -> None:
    """JSON with ``--json``, else the human form."""
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        show()


def run(stub: Any, args: argparse.Namespace) -> None:
    """Carry out ``ferryctl tenants`` over the Admin stub ``stub``."""
    if args.action == "list":
        if args.name:
            raise UsageError("tenants list takes no NAME")
        reply = stub.ListTenants(admin_pb2.ListTenantsRequest(), timeout=TIMEOUT)
        rows = [tenant_row(t) for t in reply.tenants]
        data = {"managed": reply.managed, "max_tenants": reply.max_tenants, "tenants": rows}

        def show() -> None:
            shown = [{**r, "rps": f"{r['rps']:g}" if r["rps"] else "-", "tps": f"{r['tps']:g}" if r["tps"] else "-",
                      "concurrency": r["concurrency"] or "-", "key_sha256": r["api_key_sha256"][:KEY_HASH_SHOWN] + "…"}
                     for r in rows]
            print_table(shown, ["name", "plan", "tiers", "rps", "tps", "concurrency", "key_sha256"])
            if not reply.managed:
                print("(the store holds no tenant set: each proxy serves the tenants of its config file)")
        emit(args, data, show)
        return
    if args.action == "remove":
        if not args.name:
            raise UsageError("tenants remove: give the tenant's NAME")
        reply = stub.DeleteTenant(admin_pb2.DeleteTenantRequest(name=args.name), timeout=TIMEOUT)
        emit(args, {"name": args.name, "deleted": reply.deleted},
             lambda: print(f"tenant {args.name} removed; its API key is refused within a table push"))
        return
    request, generated = build_put(args)
    answer = stub.PutTenant(request, timeout=TIMEOUT)
    row = tenant_row(answer.tenant)
    out: dict[str, Any] = {"tenant": row, "created": answer.created}
    if generated is not None:
        out["api_key"] = generated

    def show_put() -> None:
        verb = "created" if answer.created else "updated"
        print(f"tenant {row['name']} {verb}: plan {row['plan']}, tiers {','.join(row['tiers']) or '-'}, "
              f"rps {row['rps']:g}, tps {row['tps']:g}, concurrency {row['concurrency']}, "
              f"key sha256 {row['api_key_sha256'][:KEY_HASH_SHOWN]}…")
        if generated is not None:
            print(f"API key (shown once, only its sha256 is kept): {generated}")
    emit(args, out, show_put)
