"""``ferryctl status --ready-file``'s supervision rows, read from ``ferry up``'s ready file."""

from __future__ import annotations

from ferry_cli.ctl.views import supervision_rows


def test_rows_come_from_pids_restarts_and_given_up() -> None:
    ready = {"pids": {"proxy-1": 11, "etcd": 12}, "restarts": {"proxy-1": 2, "etcd": 0}, "given_up": ["etcd"]}
    assert supervision_rows(ready) == [
        {"component": "etcd", "pid": 12, "restarts": 0, "given_up": True},
        {"component": "proxy-1", "pid": 11, "restarts": 2, "given_up": False}]


def test_nothing_without_supervision() -> None:
    assert supervision_rows({"pids": {"proxy": 1}}) == [] and supervision_rows({}) == []
