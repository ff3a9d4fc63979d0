"""The supervision section of ``ferry up``'s ready file (for ``ferryctl status --ready-file``)."""

from __future__ import annotations

from ferry.cli.up.status import render, supervision


def test_rows_come_from_pids_restarts_and_given_up() -> None:
    ready = {"pids": {"proxy-1": 11, "etcd": 12}, "restarts": {"proxy-1": 2, "etcd": 0}, "given_up": ["etcd"]}
    assert supervision(ready) == [
        {"component": "etcd", "pid": 12, "restarts": 0, "given_up": True},
        {"component": "proxy-1", "pid": 11, "restarts": 2, "given_up": False}]
    lines = render(ready)
    assert lines[0] == "supervision: 2 restarts" and "PID" in lines[1]
    assert lines[2].split() == ["etcd", "12", "0", "given", "up"]
    assert lines[3].split() == ["proxy-1", "11", "2", "supervised"]


def test_nothing_without_supervision() -> None:
    assert supervision({"pids": {"proxy": 1}}) == [] and render({}) == []
