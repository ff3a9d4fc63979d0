"""Shared set-up of the batch runtime tests: quiet gRPC core logs."""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
