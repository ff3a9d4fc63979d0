"""Control plane: fleet membership, telemetry, table computation, Admin API."""
