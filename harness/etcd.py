"""A local etcd server for ``ferry up``, the benchmarks and the tests (the local harness: it imports no plane).

:class:`LocalEtcd` is a :class:`ferry.procs.Child` named ``etcd``: one
``etcd`` process on 127.0.0.1 with a data dir of its own (a fresh temporary
folder unless one is given; a folder it made is deleted by
:meth:`LocalEtcd.close`), started, waited for, stopped (by pid) and reported
(:attr:`~ferry.procs.Child.pid`) as every other child of ``ferry up`` is.
Ports are taken from the kernel (bind port 0, read it, release it) unless
given; another process may bind one before etcd does, so a first start in a
fresh dir that fails with "address already in use" takes new ports and tries
again (``PORT_ATTEMPTS``, 3). Ports are kept across :meth:`LocalEtcd.restart`, so a test can kill etcd and
bring it back on the same data dir and port. Readiness is ``GET /health``
answering ``"health": "true"``, polled every 20 ms up to a deadline; never a
sleep.

With ``tls_dir`` (a directory :func:`harness.tlsgen.generate` filled with the
names ``etcd`` and ``client``), etcd serves https with ``etcd.pem`` and
requires a client certificate signed by ``ca.pem`` (``--client-cert-auth``);
its own readiness check and admin calls show ``client.pem``.
:meth:`LocalEtcd.enable_auth` turns etcd's authentication on through its gRPC
Auth API: a ``root`` user (role ``root``) and a user with a role allowed to
read and write one key prefix, then ``AuthEnable``;
:meth:`LocalEtcd.reset_tokens` switches authentication off and on again
(:meth:`LocalEtcd.disable_auth`, :meth:`LocalEtcd.reenable_auth`), which
invalidates every token etcd handed out.

The child gets SIGKILL when its parent dies (``PR_SET_PDEATHSIG``, through
:func:`ferry.procs.dying_with_parent`), so an interrupted test or
``ferry up`` leaves no etcd behind.
Flags are those of a single-member cluster that elects itself in about 0.1 s
(heartbeat 10 ms, election timeout 100 ms), with periodic compaction
(``compaction_retention``, default ``5m``) so a long run's history stays
bounded. Cost: one process, about 25 MB of memory and a 64 MB WAL segment
preallocated on disk.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import grpc
from aetcd import rpc

from ferry.procs import Child, ChildFailed, dying_with_parent, stat_fields

PORT_ATTEMPTS = 3  # starts on fresh kernel-chosen ports when one was taken before etcd bound it
PORT_TAKEN = "address already in use"


class EtcdFailed(ChildFailed):
    """etcd is not installed, exited, or did not become healthy in time."""


def etcd_binary() -> str | None:
    """The path of the ``etcd`` binary on PATH, or None."""
    return shutil.which("etcd")


def process_state(pid: int) -> str:
    """The state letter of ``pid`` in ``/proc/PID/stat`` (``R``, ``S``, ``T``…), "" once it is gone."""
    fields = stat_fields(pid)
    return fields[0] if fields else ""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalEtcd(Child):
    """One etcd member on loopback; :meth:`start`, then :meth:`close` (or use it as a context manager)."""

    def __init__(
        self,
        *,
        data_dir: str | Path | None = None,
        client_port: int = 0,
        peer_port: int = 0,
        name: str = "ferry",
        log_path: str | Path | None = None,
        compaction_retention: str = "5m",
        binary: str | None = None,
        tls_dir: str | Path | None = None,
    ) -> None:
        self.binary = binary or etcd_binary() or ""
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="ferry-etcd-"))
        self.client_port = client_port or free_port()
        self.peer_port = peer_port or free_port()
        # kernel-chosen ports in a fresh dir: a start that loses them to another process may take new ones
        self._may_move = not client_port and not peer_port and data_dir is None
        self._started = False
        self.member = name
        self.compaction_retention = compaction_retention
        self.tls_dir = Path(tls_dir) if tls_dir is not None else None
        log = Path(log_path) if log_path is not None else self.data_dir.parent / f"{self.data_dir.name}.log"
        super().__init__("etcd", [], self.data_dir, log_path=log)

    @property
    def endpoint(self) -> str:
        """``127.0.0.1:PORT`` of the client API (what ``--store etcd://`` takes)."""
        return f"127.0.0.1:{self.client_port}"

    @property
    def url(self) -> str:
        return f"{'https' if self.tls_dir is not None else 'http'}://{self.endpoint}"

    def _tls_flags(self) -> list[str]:
        if self.tls_dir is None:
            return []
        d = self.tls_dir
        return ["--cert-file", str(d / "etcd.pem"), "--key-file", str(d / "etcd.key"),
                "--trusted-ca-file", str(d / "ca.pem"), "--client-cert-auth"]

    def _ssl_context(self) -> ssl.SSLContext | None:
        """The client side of :meth:`healthy` (``client.pem``), None without TLS."""
        if self.tls_dir is None:
            return None
        context = ssl.create_default_context(cafile=str(self.tls_dir / "ca.pem"))
        context.load_cert_chain(str(self.tls_dir / "client.pem"), str(self.tls_dir / "client.key"))
        return context

    def _channel(self) -> grpc.Channel:
        """A blocking gRPC channel for admin calls (with ``client.pem`` under TLS)."""
        if self.tls_dir is None:
            return grpc.insecure_channel(self.endpoint)
        d = self.tls_dir
        credentials = grpc.ssl_channel_credentials((d / "ca.pem").read_bytes(), (d / "client.key").read_bytes(),
                                                   (d / "client.pem").read_bytes())
        return grpc.secure_channel(self.endpoint, credentials)

    def enable_auth(self, user: str, password: str, *, root_password: str, prefix: str = "/ferry/",
                    timeout: float = 5.0) -> None:
        """Users ``root`` and ``user`` (read and write on keys under ``prefix``), then authentication on."""
        role = f"{user}-rw"
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        with self._channel() as channel:
            auth = rpc.AuthStub(channel)
            auth.RoleAdd(rpc.AuthRoleAddRequest(name="root"), timeout=timeout)
            auth.UserAdd(rpc.AuthUserAddRequest(name="root", password=root_password), timeout=timeout)
            auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=timeout)
            auth.RoleAdd(rpc.AuthRoleAddRequest(name=role), timeout=timeout)
            permission = rpc.Permission(permType=rpc.Permission.READWRITE, key=prefix.encode(), range_end=end.encode())
            auth.RoleGrantPermission(rpc.AuthRoleGrantPermissionRequest(name=role, perm=permission), timeout=timeout)
            auth.UserAdd(rpc.AuthUserAddRequest(name=user, password=password), timeout=timeout)
            auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user=user, role=role), timeout=timeout)
            auth.AuthEnable(rpc.AuthEnableRequest(), timeout=timeout)

    def disable_auth(self, root_password: str, timeout: float = 5.0) -> None:
        """Authentication off (as ``root``): every token handed out so far is invalid."""
        with self._channel() as channel:
            auth = rpc.AuthStub(channel)
            token = auth.Authenticate(rpc.AuthenticateRequest(name="root", password=root_password),
                                      timeout=timeout).token
            auth.AuthDisable(rpc.AuthDisableRequest(), timeout=timeout, metadata=(("token", token),))

    def reenable_auth(self, timeout: float = 5.0) -> None:
        """Authentication on again, with the users and roles :meth:`enable_auth` made."""
        with self._channel() as channel:
            rpc.AuthStub(channel).AuthEnable(rpc.AuthEnableRequest(), timeout=timeout)

    def reset_tokens(self, root_password: str, timeout: float = 5.0) -> None:
        """Authentication off and on again: every token handed out so far is invalid."""
        self.disable_auth(root_password, timeout)
        self.reenable_auth(timeout)

    def command(self) -> list[str]:
        """etcd's argv (through the shim that ties it to this process) for a single-member cluster."""
        peer = f"http://127.0.0.1:{self.peer_port}"
        return dying_with_parent([
            self.binary, "--name", self.member, "--data-dir", str(self.data_dir / "member-data"),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{self.member}={peer}", "--initial-cluster-state", "new",
            "--heartbeat-interval", "10", "--election-timeout", "100",
            "--auto-compaction-mode", "periodic", "--auto-compaction-retention", self.compaction_retention,
            "--log-level", "error", "--logger", "zap", *self._tls_flags(),
        ])

    def check_ready(self) -> dict[str, Any] | None:
        """``{"endpoint", "pid"}`` once ``GET /health`` answers healthy, else None."""
        return {"endpoint": self.endpoint, "pid": self.pid} if self.healthy(timeout=0.5) else None

    def start(self, timeout: float = 15.0) -> Self:
        """Start etcd and wait until it is healthy; raises EtcdFailed with its log tail otherwise."""
        if not self.binary:
            raise EtcdFailed("no etcd binary on PATH (tools/ensure_etcd.sh installs Debian's etcd-server)")
        for attempt in range(1, PORT_ATTEMPTS + 1):
            self.data_dir.mkdir(parents=True, exist_ok=True)
            try:
                super().start()
                self.wait_ready(timeout)
                break
            except ChildFailed as exc:
                lost = self._may_move and not self._started and PORT_TAKEN in str(exc)
                if not lost or attempt == PORT_ATTEMPTS:
                    if isinstance(exc, EtcdFailed):
                        raise
                    raise EtcdFailed(str(exc)) from exc
                # another process bound a port between free_port() and etcd's listen: new ports, a clean dir
                self.stop()
                shutil.rmtree(self.data_dir, ignore_errors=True)
                self.log_path.unlink(missing_ok=True)
                self.client_port, self.peer_port = free_port(), free_port()
        self._started = True
        return self

    def healthy(self, timeout: float = 1.0) -> bool:
        """Whether ``GET /health`` answers ``"health": "true"`` now."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout, context=self._ssl_context()) as response:
                return bool(json.loads(response.read()).get("health") == "true")
        except (OSError, ValueError, urllib.error.URLError):
            return False

    def signal(self, sig: int) -> None:
        """Send ``sig`` (SIGSTOP and SIGCONT pause and resume it); SIGKILL also reaps it.

        After SIGSTOP it returns once the kernel shows the process stopped (``/proc/PID/stat`` state
        ``T``, polled every millisecond for at most 2 s): a request sent right after is not answered by a
        thread that had not stopped yet.
        """
        self.kill(sig)
        if sig == signal.SIGSTOP:
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and process_state(self.pid) not in ("T", "t", ""):
                time.sleep(0.001)

    def restart(self, timeout: float = 15.0) -> Self:
        """Stop it if it runs, then start it again on the same data dir and ports."""
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stop it and delete the data dir (and log) if this object made them."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
