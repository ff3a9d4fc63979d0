"""Settings for the whole suite: quiet gRPC core logs."""

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
