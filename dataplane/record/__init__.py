"""The traffic recorder: a sampled, bounded, privacy-safe log of the requests a proxy (or a picker) ends.

Every request ends in one place, :meth:`dataplane.api.service.InferenceServicer.count` (both front doors and
the endpoint picker); there :meth:`Recorder.record` decides whether the request is recorded and, if so, builds
its row. The rows ride on the proxy's usage report on the table watch (``Report.traffic``, at most
``record_report_rows`` a report, the rest waiting up to ``record_max_rows``) to the control plane, whose
leader keeps them (:mod:`controlplane.traffic`) for ``ferryctl traffic export``.

- :mod:`.row` (pure): the sampler (a CRC-32 of the request id against the rate), the tenant's hash, a
  request's row;
- :mod:`.recorder`: the bounded buffer, what each report takes, the two counters.

A row holds sizes, times, hashes and where the request went; never a prompt, an answer, a request id or a
tenant's name (docs/CONTRACTS.md, The recorded row).
"""
