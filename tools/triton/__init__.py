"""Tools that run a real Triton Inference Server for Ferry's tests (see docs/triton.md)."""
