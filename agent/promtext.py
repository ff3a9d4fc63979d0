"""A small parser of the Prometheus text exposition format (version 0.0.4).

:func:`parse` turns the text into :class:`Sample` rows (name, labels, value);
``# HELP`` / ``# TYPE`` comments, blank lines and timestamps are skipped, label
values are unescaped (``\\\\``, ``\\"``, ``\\n``), and ``NaN``/``+Inf``/``-Inf``
are read as floats. A malformed line is skipped, not fatal: one odd metric of
a real server must not blind the agent to the others. :class:`Samples` looks
values up by name and a subset of labels.

Cost: O(text) to parse; with ``names`` (the families a caller reads), a
line of another family costs only the search for its name's end. A lookup
is O(samples of that name).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping

_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


@dataclasses.dataclass(frozen=True)
class Sample:
    """One line of the exposition."""

    name: str
    labels: Mapping[str, str]
    value: float


def parse(text: str, names: Collection[str] | None = None) -> list[Sample]:
    """The samples of ``text``; malformed lines are skipped. With ``names``, only the samples of those
    metric names: other lines are skipped after reading their name, unparsed."""
    samples: list[Sample] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if names is not None and _name(line) not in names:
            continue
        sample = _parse_line(line)
        if sample is not None:
            samples.append(sample)
    return samples


def _name(line: str) -> str:
    """The metric name a sample line starts with (up to ``{`` or a space)."""
    end = len(line)
    for stop in ("{", " "):
        at = line.find(stop, 0, end)
        if at != -1:
            end = at
    return line[:end]


def _parse_line(line: str) -> Sample | None:
    brace = line.find("{")
    space = line.find(" ")
    labels: dict[str, str] = {}
    if brace != -1 and (space == -1 or brace < space):
        name, rest = line[:brace], line[brace + 1:]
        parsed = _parse_labels(rest)
        if parsed is None:
            return None
        labels, rest = parsed
    elif space != -1:
        name, rest = line[:space], line[space:]
    else:
        return None
    fields = rest.split()
    if not name or not fields:
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    return Sample(name, labels, value)


def _parse_labels(text: str) -> tuple[dict[str, str], str] | None:
    labels: dict[str, str] = {}
    pos = 0
    while True:
        while pos < len(text) and text[pos] in " ,":
            pos += 1
        if pos < len(text) and text[pos] == "}":
            return labels, text[pos + 1:]
        eq = text.find("=", pos)
        if eq == -1 or eq + 1 >= len(text) or text[eq + 1] != '"':
            return None
        key = text[pos:eq].strip()
        pos = eq + 2
        value: list[str] = []
        while pos < len(text) and text[pos] != '"':
            if text[pos] == "\\" and pos + 1 < len(text):
                value.append(_ESCAPES.get(text[pos + 1], text[pos + 1]))
                pos += 2
            else:
                value.append(text[pos])
                pos += 1
        if pos >= len(text):
            return None
        labels[key] = "".join(value)
        pos += 1


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
        return sum(found) if found else None

    def mean(self, name: str) -> float | None:
        """The mean value of all samples of ``name`` (for per-GPU gauges); None when there are none."""
        values = [s.value for s in self._by_name.get(name, ())]
        return sum(values) / len(values) if values else None
