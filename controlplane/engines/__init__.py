"""The fleet as the simulator sees it: the engine model's step parameters fitted from the replicas' telemetry.

Pure: :mod:`.fit` (non-negative least squares of the step time on the four
step counts, standard errors, the fit's error, what the samples cannot tell),
:mod:`.window` (samples per model and replica kind, bounded in count, age and
keys). Edge: :mod:`controlplane.services.engines` (samples taken out of the
agents' telemetry, relayed by followers to the leader, fitted for
``Admin.GetEngines``).
"""
