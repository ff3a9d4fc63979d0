"""The control plane: fleet membership, telemetry, operator intent, and the tables it pushes to proxies.

Layers, bottom up (docs/design.md, "The control plane's layers"; no
subpackage imports one above it): :mod:`.store` (keys and bytes: where
membership, intent and leadership live), :mod:`.config` (the settings),
:mod:`.validate` (domain values checked, the field named), the concerns'
records and pure policy (:mod:`.allocation`, :mod:`.engines`, :mod:`.fleet`,
:mod:`.regions`, :mod:`.rollout`, :mod:`.routerconfig`, :mod:`.tenants`,
:mod:`.traffic`), :mod:`.intent` (operator intent decoded and written),
:mod:`.tables` (compute, version, serve), :mod:`.metrics`, :mod:`.scaling`
and :mod:`.cluster` (what reads the tables), :mod:`.services` (each concern's
operations), :mod:`.api` (the wire: the only place that speaks gRPC),
:mod:`.controller` (the composition root: the shared state and the services,
their callbacks and loops), :mod:`.server` (one control plane in a process),
:mod:`.main` (``ferry controlplane``).
"""
