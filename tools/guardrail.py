"""A reference guardrail hook: a keyword and regular-expression classifier serving ``ferry.v1.Guardrail``.

Rules, checked in order on the text of each ``Check`` (a prompt, or a window
of an answer with the end of what was released before it as context):

- ``--deny REGEX`` (repeatable): a match anywhere in context + text is DENY,
  the reason naming the rule (``matched deny rule 2``), never the text;
- ``--redact REGEX`` (repeatable): each match in the text is replaced by
  ``[redacted]``; the answer is REDACT when anything was replaced;
- otherwise ALLOW.

Patterns are compiled case-insensitive; each is at most 256 characters and
the text is matched as given (the proxy bounds it: a prompt by its limit, a
window by ``every_tokens``). ``--delay-ms`` delays every answer (to try a
hook's ``timeout_ms`` and ``on_error``). Counts per verdict are kept in
:attr:`Classifier.verdicts`.

Usage::

    python -m tools.guardrail --listen 127.0.0.1:7001 --deny 'build a bomb' --redact '\\b\\d{3}-\\d{2}-\\d{4}\\b'

It writes ``{"address": …, "pid": …}`` to ``--ready-file`` once serving, and
stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import grpc

from ferry.process import stop_event, write_ready_file
from ferry.v1 import guardrail_pb2, guardrail_pb2_grpc

MAX_PATTERN = 256
REDACTED = "[redacted]"


class Classifier(guardrail_pb2_grpc.GuardrailServicer):
    """Deny and redact rules over the checked text (module doc); ``delay`` seconds before each answer."""

    def __init__(self, deny: Sequence[str] = (), redact: Sequence[str] = (), *, delay: float = 0.0) -> None:
        for pattern in (*deny, *redact):
            if len(pattern) > MAX_PATTERN:
                raise ValueError(f"pattern longer than {MAX_PATTERN} characters: {pattern[:32]!r}…")
        self.deny = [re.compile(p, re.IGNORECASE) for p in deny]
        self.redact = [re.compile(p, re.IGNORECASE) for p in redact]
        self.delay = delay
        self.verdicts: Counter[str] = Counter()

    def classify(self, text: str, context: str = "") -> guardrail_pb2.CheckResponse:
        """The verdict on ``text`` (``context``: what came before it, seen by the deny rules only)."""
        seen = context + text
        for i, rule in enumerate(self.deny, 1):
            if rule.search(seen):
                self.verdicts["deny"] += 1
                return guardrail_pb2.CheckResponse(action=guardrail_pb2.GUARD_ACTION_DENY,
                                                   reason=f"matched deny rule {i}")
        out = text
        for rule in self.redact:
            out = rule.sub(REDACTED, out)
        if out != text:
            self.verdicts["redact"] += 1
            return guardrail_pb2.CheckResponse(action=guardrail_pb2.GUARD_ACTION_REDACT, text=out,
                                               reason="redacted")
        self.verdicts["allow"] += 1
        return guardrail_pb2.CheckResponse(action=guardrail_pb2.GUARD_ACTION_ALLOW)

    async def Check(self, request: guardrail_pb2.CheckRequest, context: Any) -> guardrail_pb2.CheckResponse:
        """One verdict, after ``delay``."""
        if self.delay:
            await asyncio.sleep(self.delay)
        return self.classify(request.text, request.context)


async def serve(classifier: Classifier, listen: str) -> tuple[grpc.aio.Server, int]:
    """Start a server for ``classifier`` on ``listen``; (server, port)."""
    server = grpc.aio.server()
    guardrail_pb2_grpc.add_GuardrailServicer_to_server(classifier, server)
    port = server.add_insecure_port(listen)
    await server.start()
    return server, port


async def _run(args: argparse.Namespace) -> int:
    stop = stop_event()
    classifier = Classifier(args.deny, args.redact, delay=args.delay_ms / 1000.0)
    server, port = await serve(classifier, args.listen)
    host = args.listen.rpartition(":")[0]
    write_ready_file(args.ready_file, {"address": f"{host}:{port}", "pid": os.getpid()})
    await stop.wait()
    await server.stop(1.0)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m tools.guardrail``."""
    parser = argparse.ArgumentParser(prog="python -m tools.guardrail", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--deny", action="append", default=[], metavar="REGEX")
    parser.add_argument("--redact", action="append", default=[], metavar="REGEX")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--ready-file", default=None)
    args = parser.parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except (ValueError, re.error) as exc:
        parser.error(str(exc))
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
