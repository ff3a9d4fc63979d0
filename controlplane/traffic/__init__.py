"""Recorded traffic: the proxies' sampled rows (:mod:`dataplane.record`), kept by the leader for export.

- :mod:`.rows` (pure): a ``TrafficRow`` to a JSON object and back, checked;
- :mod:`.store`: where the leader keeps them: JSON Lines segment files in ``traffic_dir``, rotated by size and
  age, the whole bounded by bytes and age; or, without a directory, a bounded ring in memory;
- :mod:`controlplane.services.traffic`: rows taken off each proxy's report as it arrives (so the last report a
  control plane keeps and relays carries none), stored on the leader, relayed once each by a follower
  (``FollowerReport.traffic``), read back for ``Admin.ExportTraffic`` (:mod:`controlplane.api.traffic`).
"""
