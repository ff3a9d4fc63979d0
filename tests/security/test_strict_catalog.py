"""With ``strict_catalog`` on, an agent cannot introduce a model the catalog does not name."""

from __future__ import annotations

import pytest

from controlplane import validate
from controlplane.config import ControlPlaneSettings
from ferry.errors import InvalidArgument
from ferry.v1 import fleet_pb2
from tests.controlplane.fakes import register, replica

KNOWN = frozenset({"chat"})
CASES = [
    ("strict-known-register", True, "register", "chat", None),
    ("strict-unknown-register", True, "register", "evil", "register.replicas[0].model"),
    ("strict-unknown-telemetry", True, "telemetry", "evil", "telemetry.changed[0].model"),
    ("open-unknown-register", False, "register", "evil", None),  # the default: adopted Triton models
    ("open-unknown-telemetry", False, "telemetry", "evil", None),
]


@pytest.mark.parametrize(("strict", "where", "model", "named"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_unknown_models_are_refused_naming_the_field(strict: bool, where: str, model: str, named: str | None) -> None:
    settings = ControlPlaneSettings(strict_catalog=strict)
    known = KNOWN if settings.strict_catalog else None
    info = replica("n1-r0", model)

    def check() -> None:
        if where == "register":
            validate.check_register(register("n1", info), settings, known)
        else:
            validate.check_telemetry(fleet_pb2.Telemetry(seq=1, changed=[info]), settings, known)

    if named is None:
        check()
    else:
        with pytest.raises(InvalidArgument) as refused:
            check()
        assert refused.value.field == named and "not in the catalog" in refused.value.reason
