"""One scrape of a Prometheus endpoint: ``GET`` with aiohttp, the text read by ``prometheus_client``'s parser.

- :func:`fetch` / :func:`get_text`: ``GET url`` (``http://`` only) with one
  deadline over the whole exchange (``timeout_seconds``) and a bound on the
  body (``max_bytes``, default ``MAX_BODY_BYTES``); aiohttp reads
  ``Content-Length``, chunked and close-delimited bodies. Every failure
  raises :class:`HttpError` (``get_text`` also for a status other than 200).
- :func:`parse`: the samples of an exposition (text format 0.0.4) by
  ``prometheus_client.parser.text_string_to_metric_families``. ``# HELP`` /
  ``# TYPE`` lines are left out before the library reads the text, so every
  sample keeps the name the exposition gives it (the library would rename a
  counter's samples ``…_total``, also Triton's counters exported without
  it) and readers look samples up by the names they see on the page;
  histograms are their ``_bucket`` (label ``le``), ``_sum`` and ``_count``
  samples. With ``names`` (the families a caller reads), only the lines of
  those sample names are handed to the library. A malformed line is
  skipped, not fatal: when the library refuses the text, it reads it again
  line by line and keeps every line it accepts, so one odd metric of a real
  server does not blind the agent to the others.
- :class:`Samples`: samples by name; the sum of those with a subset of
  labels, or the mean of a family (per-GPU gauges).

Cost: one connection per :func:`get_text` without a session (the agent's
endpoints keep one session each); O(body) time and memory. O(text) to
parse; with ``names``, a line of another family costs only the search for
its name's end; a malformed line costs one more pass over the text. A
lookup is O(samples of that name).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = ["MAX_BODY_BYTES", "HttpError", "Sample", "Samples", "fetch", "get_text", "parse"]

MAX_BODY_BYTES = 8 * 1024 * 1024  # a metrics page (or a model list) larger than this is refused


class HttpError(Exception):
    """A GET failed: unreachable, timed out, not 200 (for :func:`get_text`), over the size bound, or not http."""


async def fetch(session: aiohttp.ClientSession, url: str, *, timeout_seconds: float | None = None,
                max_bytes: int = MAX_BODY_BYTES) -> tuple[int, str]:
    """(status, body as text) of ``GET url`` on ``session`` (``timeout_seconds`` None: the session's timeout);
    raises HttpError when there is no answer in time or the body is over ``max_bytes``."""
    if not url.startswith("http://"):
        raise HttpError(f"{url}: only http://host:port/path URLs are supported")
    timeout = aiohttp.ClientTimeout(total=timeout_seconds) if timeout_seconds is not None else None
    try:
        async with session.get(url, timeout=timeout) as response:
            body = await response.content.read(max_bytes + 1)
            if len(body) > max_bytes:
                raise HttpError(f"{url}: body over the limit of {max_bytes} bytes")
            return response.status, body.decode("utf-8", errors="replace")
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise HttpError(f"{url}: {type(exc).__name__} {exc}".strip()) from exc


async def get_text(url: str, *, session: aiohttp.ClientSession | None = None, timeout_seconds: float = 2.0,
                   max_bytes: int = MAX_BODY_BYTES) -> str:
    """The body of ``GET url`` (status 200) as text, on ``session`` or a session of its own; raises HttpError."""
    if session is not None:
        status, body = await fetch(session, url, timeout_seconds=timeout_seconds, max_bytes=max_bytes)
    else:
        async with aiohttp.ClientSession() as own:
            status, body = await fetch(own, url, timeout_seconds=timeout_seconds, max_bytes=max_bytes)
    if status != 200:
        raise HttpError(f"{url}: HTTP status {status}")
    return body


def parse(text: str, names: Collection[str] | None = None) -> list[Sample]:
    """The samples of ``text`` under their exposition names; malformed lines are skipped. With ``names``, only
    the samples of those names: other lines are skipped after reading their name, unparsed."""
    lines = [line for line in text.splitlines()
             if line.strip() and not line.lstrip().startswith("#")
             and (names is None or _name(line.strip()) in names)]
    try:
        return _samples("\n".join(lines) + "\n")
    except ValueError:
        pass
    found: list[Sample] = []
    for line in lines:
        try:
            found += _samples(line + "\n")
        except ValueError:
            continue
    return found


def _samples(text: str) -> list[Sample]:
    return [sample for family in text_string_to_metric_families(text) for sample in family.samples]


def _name(line: str) -> str:
    """The metric name a sample line starts with (up to ``{`` or a space)."""
    end = len(line)
    for stop in ("{", " "):
        at = line.find(stop, 0, end)
        if at != -1:
            end = at
    return line[:end]


class Samples:
    """Samples indexed by metric name."""

    def __init__(self, samples: Iterable[Sample]) -> None:
        self._by_name: dict[str, list[Sample]] = {}
        for s in samples:
            self._by_name.setdefault(s.name, []).append(s)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def all(self, name: str) -> list[Sample]:
        """Every sample of ``name``."""
        return list(self._by_name.get(name, ()))

    def get(self, name: str, **labels: str) -> float | None:
        """The sum of the samples of ``name`` whose labels include ``labels``; None when there are none."""
        found = [s.value for s in self._by_name.get(name, ()) if all(s.labels.get(k) == v for k, v in labels.items())]
        return float(sum(found)) if found else None

    def mean(self, name: str) -> float | None:
        """The mean value of all samples of ``name`` (for per-GPU gauges); None when there are none."""
        values = [s.value for s in self._by_name.get(name, ())]
        return sum(values) / len(values) if values else None
