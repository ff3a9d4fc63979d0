"""A throw-away CA and certificates for ``ferry up --tls`` and tests, made with the ``openssl`` command.

:func:`generate` writes ``ca.pem`` and, for each name, ``NAME.pem`` and
``NAME.key`` (:func:`issue`, which also renews one): P-256 keys, valid for
``days`` days, with the common name NAME, subject alternative names ``IP:127.0.0.1`` and ``DNS:localhost`` (or ``san``),
and both server and client use, so one certificate serves a component in both roles.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from ferry.tls import TLSConfig

SAN = "IP:127.0.0.1,DNS:localhost"
EXT = "subjectAltName={san}\nextendedKeyUsage=serverAuth,clientAuth\n"
CURVE = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def generate(directory: str | Path, names: tuple[str, ...], *, days: int = 2, san: str = SAN) -> dict[str, TLSConfig]:
    """A CA in ``directory`` and a signed certificate per name; returns each name's TLS config."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", *CURVE, "-keyout", "ca.key", "-out", "ca.pem", "-days", str(days),
             "-subj", "/CN=ferry-throwaway-ca", cwd=d)
    return {name: issue(d, name, days=days, san=san) for name in names}


def issue(directory: str | Path, name: str, *, days: int = 2, san: str = SAN) -> TLSConfig:
    """A new key and certificate for ``name`` (``NAME.pem``, ``NAME.key``, replaced) from the CA in ``directory``:
    a renewal, as cert-manager makes one (same CA and common name, another key and serial)."""
    d = Path(directory)
    (d / "ext.cnf").write_text(EXT.format(san=san))
    _openssl("req", *CURVE, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", str(days), "-extfile", "ext.cnf", cwd=d)
    (d / f"{name}.key").chmod(0o600)
    return TLSConfig.load(d / "ca.pem", d / f"{name}.pem", d / f"{name}.key")


def paths(directory: str | Path, name: str) -> list[str]:
    """The ``--tls-ca``, ``--tls-cert`` and ``--tls-key`` flags for ``name``'s files in ``directory``."""
    d = Path(directory)
    return ["--tls-ca", str(d / "ca.pem"), "--tls-cert", str(d / f"{name}.pem"), "--tls-key", str(d / f"{name}.key")]
