"""Model version rollouts: a canary share, then promote or roll back.

Pure: :mod:`.plan` (the operator's record and the table weights it implies).
Edge: :mod:`controlplane.services.rollout` (start, advance, abort through the
intent writer).
"""
