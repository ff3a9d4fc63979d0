"""Data plane proxy: the public Inference API, admission, pick and forwarding."""
