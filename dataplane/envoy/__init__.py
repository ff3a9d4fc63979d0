"""Envoy as Ferry's HTTP data plane: the bootstrap (:mod:`.bootstrap`) and the process (:mod:`.process`)."""
