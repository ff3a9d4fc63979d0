"""The control plane's own errors: states of the plane a call may meet, beside :mod:`ferry.errors`.

Domain modules and services raise these and the :mod:`ferry.errors` classes
(``InvalidArgument`` naming the field, ``NotFound``, ``AlreadyExists``,
``Overloaded``, ``Unavailable``, ...); none of them knows a gRPC status. The
one translation to a status is :func:`controlplane.api.status.status_of`.
A leaf: it imports nothing of the plane.
"""

from __future__ import annotations

from ferry.errors import FerryError


class FailedPrecondition(FerryError):
    """The call cannot run in this control plane's state (e.g. it needs the leader and this one follows)."""


class Aborted(FerryError):
    """A stream ended because another took its place (the same node or proxy opened a new one)."""


class Unimplemented(FerryError):
    """This control plane does not offer the call (a part it needs was not configured)."""
