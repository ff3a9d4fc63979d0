"""The agents' join check (:class:`JoinCheck`): who may register a node, from the join token and the peer certificate.

An agent is admitted when either holds:

- its ``Register.join_token`` hashes (sha256, compared in constant time) to
  the control plane's join token hash (``[controlplane] join_token_sha256``,
  ``--join-token-file`` or env ``FERRY_JOIN_TOKEN``);
- the stream runs over mutual TLS and the client certificate's common name
  is ``agent`` (:data:`AGENT_CN`).

With neither a join token nor mutual TLS configured, admission is open
(``open`` is true; ``ferry controlplane`` warns at start). A refusal is
:class:`ferry.errors.Unauthenticated` naming ``register.join_token``; the
token itself is never logged nor put in an error. Pure: the caller passes the
peer's common name. Cost: one sha256 per registration.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass

from controlplane.api.auth import read_token_file
from ferry.errors import ConfigError, Unauthenticated

AGENT_CN = "agent"
ENV = "FERRY_JOIN_TOKEN"


def sha256_hex(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class JoinCheck:
    """The join token's sha256 ("" for none) and whether agents come over mutual TLS."""

    join_token_sha256: str = ""
    mutual_tls: bool = False

    @property
    def open(self) -> bool:
        """No join token and no mutual TLS: any agent is admitted."""
        return not self.join_token_sha256 and not self.mutual_tls

    def check(self, join_token: str, peer_common_name: str | None) -> None:
        """Admit or raise Unauthenticated naming the field (see the module doc)."""
        if self.open:
            return
        if self.mutual_tls and peer_common_name == AGENT_CN:
            return
        if not join_token:
            how = " or a client certificate with common name 'agent'" if self.mutual_tls else ""
            raise Unauthenticated(f"register.join_token: required (agent --join-token or env {ENV}){how}")
        if not self.join_token_sha256 or not hmac.compare_digest(sha256_hex(join_token), self.join_token_sha256):
            raise Unauthenticated("register.join_token: not accepted")


def load(config_sha256: str, token_file: str | None, *, mutual_tls: bool,
         env: Mapping[str, str] = os.environ) -> JoinCheck:
    """The join check from the flag's file, else env ``FERRY_JOIN_TOKEN``, else the config's hash."""
    wanted = config_sha256.strip().lower()
    if wanted and (len(wanted) != 64 or any(c not in "0123456789abcdef" for c in wanted)):
        raise ConfigError("controlplane.join_token_sha256", "must be a sha256 in hex (64 characters)")
    token = read_token_file("--join-token-file", token_file) if token_file else env.get(ENV, "").strip()
    if token and wanted and sha256_hex(token) != wanted:
        raise ConfigError("controlplane.join_token_sha256", f"does not match the token of --join-token-file or {ENV}")
    return JoinCheck(sha256_hex(token) if token else wanted, mutual_tls)
