"""Generated stubs of the Ferry wire contract (proto/ferry/v1)."""
