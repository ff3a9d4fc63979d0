"""Production etcd access against a real etcd: client TLS (``--client-cert-auth``), a user with a role on the
store's prefix, the token renewed when etcd invalidates it, a list of endpoints with a dead one first; and
what is refused: a wrong password, a client certificate etcd does not trust, bad ``store_*`` settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tomli_w import dumps

from controlplane.config import ControlPlaneSettings
from controlplane.store.etcd import EtcdStore, parse_endpoint
from controlplane.store.etcdaccess import EtcdAccess, TokenAuth
from ferry.errors import ConfigError, Unavailable
from ferry.procs import Child
from ferry.tls import TLSConfig
from harness.etcd import LocalEtcd, etcd_binary, free_port
from harness.tlsgen import generate
from tests.e2e.harness import wait_for
from tests.etcd.test_store_up import store_up

USER, PASSWORD, ROOT_PASSWORD = "ferry", "ferry-password", "root-password"


@pytest.fixture
def secure_etcd(tmp_path: Path) -> Iterator[LocalEtcd]:
    """etcd serving https to client certificates of its CA only, with authentication on (users root and ferry)."""
    if etcd_binary() is None:
        pytest.fail("no etcd binary on PATH: run tools/ensure_etcd.sh")
    generate(tmp_path / "tls", ("etcd", "client"))
    server = LocalEtcd(tls_dir=tmp_path / "tls").start()
    try:
        server.enable_auth(USER, PASSWORD, root_password=ROOT_PASSWORD)
        yield server
    finally:
        server.close()


def client_tls(directory: Path) -> TLSConfig:
    return TLSConfig.load(directory / "ca.pem", directory / "client.pem", directory / "client.key")


def access(tmp_path: Path, password: str = PASSWORD) -> EtcdAccess:
    return EtcdAccess(tls=client_tls(tmp_path / "tls"), user=USER, password=password)


async def test_the_store_works_with_tls_and_a_user(tmp_path: Path, secure_etcd: LocalEtcd) -> None:
    store = EtcdStore(secure_etcd.endpoint, timeout=2.0, access=access(tmp_path))
    try:
        watch = await store.watch("/ferry/t/")
        lease = await store.grant_lease(5)
        revision = await store.put("/ferry/t/a", b"1", lease=lease)
        assert revision > 0
        await store.refresh_lease(lease)  # the keeper's own channel: TLS and a token of its own
        item = await store.get("/ferry/t/a")
        assert item is not None and item.value == b"1" and item.lease == lease
        assert [kv.key for kv in (await store.list("/ferry/t/")).items] == ["/ferry/t/a"]
        async for event in watch:
            assert event.key == "/ferry/t/a"
            break
        await watch.close()
        with pytest.raises(Unavailable, match="permission denied"):
            await store.put("/elsewhere", b"x")  # the role covers /ferry/ only
        assert not store.health().ok and "permission denied" in store.health().error
        await store.put("/ferry/t/b", b"2")
        assert store.health().ok
    finally:
        await store.close()


async def test_a_wrong_password_is_refused_naming_the_user(tmp_path: Path, secure_etcd: LocalEtcd) -> None:
    store = EtcdStore(secure_etcd.endpoint, timeout=2.0, access=access(tmp_path, password="wrong"))
    try:
        with pytest.raises(Unavailable) as err:
            await store.put("/ferry/t/a", b"1")
        message = str(err.value)
        assert "user 'ferry' not authenticated" in message and "invalid user ID or password" in message, message
        assert secure_etcd.endpoint in message
        health = store.health()
        assert not health.ok and "not authenticated" in health.error
    finally:
        await store.close()


async def test_a_client_certificate_etcd_does_not_trust_is_refused_naming_tls(
        tmp_path: Path, secure_etcd: LocalEtcd) -> None:
    other = generate(tmp_path / "other", ("client",))["client"]  # a certificate of another CA
    own_ca = client_tls(tmp_path / "tls").ca
    tls = TLSConfig(ca=own_ca, cert=other.cert, key=other.key)
    store = EtcdStore(secure_etcd.endpoint, timeout=2.0, access=EtcdAccess(tls=tls, user=USER, password=PASSWORD))
    try:
        with pytest.raises(Unavailable) as err:
            await store.put("/ferry/t/a", b"1")
        assert "TLS handshake failed" in str(err.value) and "store_tls_cert" in str(err.value), str(err.value)
        assert not store.health().ok and "TLS handshake failed" in store.health().error
    finally:
        await store.close()


async def test_a_missing_client_certificate_is_refused_naming_tls(tmp_path: Path, secure_etcd: LocalEtcd) -> None:
    tls = TLSConfig(ca=client_tls(tmp_path / "tls").ca, cert=None, key=None)  # type: ignore[arg-type]
    store = EtcdStore(secure_etcd.endpoint, timeout=2.0, access=EtcdAccess(tls=tls, user=USER, password=PASSWORD))
    try:
        with pytest.raises(Unavailable) as err:
            await store.put("/ferry/t/a", b"1")  # etcd's --client-cert-auth: no certificate, no connection
        assert "TLS handshake failed" in str(err.value) and "store_tls_cert" in str(err.value), str(err.value)
        assert not store.health().ok and "TLS handshake failed" in store.health().error
    finally:
        await store.close()


async def test_plain_text_to_an_etcd_serving_tls_is_unreachable(secure_etcd: LocalEtcd) -> None:
    store = EtcdStore(secure_etcd.endpoint, timeout=2.0, access=EtcdAccess(user=USER, password=PASSWORD))
    try:
        with pytest.raises(Unavailable, match="unreachable"):
            await store.put("/ferry/t/a", b"1")  # etcd closes the socket
        assert not store.health().ok
    finally:
        await store.close()


async def test_the_token_is_renewed_when_etcd_invalidates_it(tmp_path: Path, secure_etcd: LocalEtcd,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    renewed: list[str] = []  # the stale tokens a call was refused for, then authenticated again
    original = TokenAuth._token

    async def counting(self: TokenAuth, stale: str = "") -> str:
        if stale:
            renewed.append(stale)
        return await original(self, stale)

    monkeypatch.setattr(TokenAuth, "_token", counting)
    store = EtcdStore(secure_etcd.endpoint, timeout=2.0, access=access(tmp_path))
    try:
        lease = await store.grant_lease(30)
        await store.put("/ferry/t/a", b"1", lease=lease)
        await store.refresh_lease(lease)
        secure_etcd.reset_tokens(ROOT_PASSWORD)  # every token handed out so far is invalid now
        await store.put("/ferry/t/a", b"2")  # authenticated again, sent once more
        assert len(renewed) == 1, renewed
        item = await store.get("/ferry/t/a")
        assert item is not None and item.value == b"2"
        watch = await store.watch("/ferry/t/")  # a new stream with the new token
        await store.put("/ferry/t/b", b"3")
        async for event in watch:
            assert event.key == "/ferry/t/b"
            break
        await watch.close()
        secure_etcd.reset_tokens(ROOT_PASSWORD)
        for _ in range(2):  # the keeper's stream: refused once for its token at worst, then a new one
            try:
                await store.refresh_lease(lease)
                break
            except Unavailable:
                continue
        else:
            pytest.fail("lease refresh did not recover after the token was invalidated")
        assert store.health().ok
    finally:
        await store.close()


async def test_a_user_works_while_etcd_has_authentication_off_and_after_it_is_turned_on(
        tmp_path: Path, secure_etcd: LocalEtcd) -> None:
    secure_etcd.disable_auth(ROOT_PASSWORD)
    store = EtcdStore(secure_etcd.endpoint, timeout=2.0, access=access(tmp_path))
    try:
        await store.put("/ferry/t/a", b"1")  # Authenticate: "not enabled"; sent without a token
        lease = await store.grant_lease(30)
        await store.refresh_lease(lease)
        secure_etcd.reenable_auth()
        await store.put("/ferry/t/a", b"2")  # refused for no token, authenticated, sent once more
        item = await store.get("/ferry/t/a")
        assert item is not None and item.value == b"2"
        with pytest.raises(Unavailable, match="permission denied"):
            await store.put("/elsewhere", b"x")  # as the user, not unauthenticated
        assert store.health().error.count("permission denied") == 1
    finally:
        await store.close()


async def test_a_user_against_an_etcd_without_authentication_sends_no_token(etcd: LocalEtcd) -> None:
    store = EtcdStore(etcd.endpoint, timeout=2.0, access=EtcdAccess(user=USER, password=PASSWORD))
    try:
        watch = await store.watch("/ferry/t/")
        await store.put("/ferry/t/a", b"1")
        async for event in watch:
            assert event.key == "/ferry/t/a"
            break
        await watch.close()
        assert store.health().ok
    finally:
        await store.close()


async def test_a_dead_endpoint_listed_first_fails_over_to_the_next(etcd: LocalEtcd) -> None:
    dead = f"127.0.0.1:{free_port()}"
    store = EtcdStore(f"etcd://{dead},{etcd.endpoint}", timeout=2.0)
    try:
        with pytest.raises(Unavailable):
            await store.refresh_lease(1)  # the keeper's channel opens to the dead endpoint
        with pytest.raises(Unavailable, match=dead):
            await store.put("/ferry/t/a", b"1")
        await store.put("/ferry/t/a", b"1")  # the channel moved to the next endpoint
        lease = await store.grant_lease(5)
        for attempt in range(2):  # the keeper follows at its next failure
            try:
                await store.refresh_lease(lease)
                break
            except Unavailable:
                assert attempt == 0
        assert store.health().ok
    finally:
        await store.close()


@pytest.mark.parametrize(("url", "named"), [("etcd://127.0.0.1:2379,nope", "'nope'"),
                                            ("etcd://127.0.0.1:2379,127.0.0.1:2379", "twice")])
def test_a_bad_endpoint_in_the_list_is_named(url: str, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        parse_endpoint(url)


def test_endpoints_parse_in_order() -> None:
    assert parse_endpoint("etcd://h1:2379,h2:2379,h3:2379") == "h1:2379,h2:2379,h3:2379"


def test_bad_store_settings_are_refused_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="controlplane.store_tls_key"):
        ControlPlaneSettings(store_tls_ca="ca.pem", store_tls_cert="c.pem")
    with pytest.raises(ConfigError, match="controlplane.store_tls_ca"):
        ControlPlaneSettings(store_tls_ca=str(tmp_path / "absent"), store_tls_cert="c", store_tls_key="k"
                             ).store_access(env={})
    with pytest.raises(ConfigError, match="controlplane.store_password_file"):
        ControlPlaneSettings(store_user="ferry").store_access(env={})
    with pytest.raises(ConfigError, match="controlplane.store_user"):
        ControlPlaneSettings().store_access(env={"FERRY_ETCD_PASSWORD": "x"})
    password = tmp_path / "password"
    password.write_text("from-file\n")
    settings = ControlPlaneSettings(store_user="ferry", store_password_file=str(password))
    assert settings.store_access(env={"FERRY_ETCD_PASSWORD": "env"}).password == "from-file"
    assert ControlPlaneSettings(store_user="ferry").store_access(env={"FERRY_ETCD_PASSWORD": "env"}).password == "env"


def test_a_control_plane_serves_with_tls_a_user_and_a_dead_endpoint_first(
        tmp_path: Path, secure_etcd: LocalEtcd) -> None:
    tls = tmp_path / "tls"
    config = tmp_path / "ferry.toml"
    config.write_text(dumps({"controlplane": {
        "store_timeout_seconds": 2.0, "tick_seconds": 0.2, "store_tls_ca": str(tls / "ca.pem"),
        "store_tls_cert": str(tls / "client.pem"), "store_tls_key": str(tls / "client.key"), "store_user": USER}}))
    store = f"etcd://127.0.0.1:{free_port()},{secure_etcd.endpoint}"
    cp = Child("controlplane", ["controlplane", "--listen", "127.0.0.1:0", "--store", store, "--id", "cp-1",
                                "--config", str(config), "--insecure"], tmp_path,
               env={"FERRY_ETCD_PASSWORD": PASSWORD}).start()
    try:
        metrics = cp.wait_ready()["metrics"]
        wait_for(lambda: store_up(metrics) == 1.0, 30, "store_up 1 through TLS, a token and the second endpoint")
    finally:
        cp.stop()
