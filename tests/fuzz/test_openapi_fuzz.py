"""The HTTP API fuzzed from its own OpenAPI document by schemathesis, against a real ``ferry proxy`` process.

The document is the one the proxy serves (``GET /openapi.json``, :func:`dataplane.api.schema.openapi`), read
from the running proxy, so what is fuzzed is what clients are told. Schemathesis makes requests that fit it
(positive) and requests that break it (negative). Every answer must hold:

- no 5xx (``not_a_server_error``): a body the schema admits may be refused (a model not served, a field the
  model cannot serve), never crash the proxy;
- the answer's status, content type and body as the document declares them (``status_code_conformance``,
  ``content_type_conformance``, ``response_schema_conformance``): every error in OpenAI's shape;
- a body that breaks the schema is refused with a 4xx (``negative_data_rejection``);
- every 400 names the field (``param``) (:func:`names_the_field`);

and the proxy still answers ``/health`` after the run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import checks
from schemathesis.core.control import SkipTest
from schemathesis.generation import GenerationMode

from tests.fuzz.test_http_fuzz import HttpProxy, proxy  # noqa: F401  (the module's proxy fixture)

pytestmark = [pytest.mark.fuzz, pytest.mark.e2e, pytest.mark.timeout(600)]

CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_schema_conformance, checks.negative_data_rejection]


def names_the_field(ctx: Any, response: Any, case: Any) -> None:
    """A 400 names the field at fault in ``error.param`` (OpenAI's shape)."""
    if response.status_code == 400:
        error = json.loads(response.content)["error"]
        if not isinstance(error.get("param"), str) or not error["param"]:
            raise AssertionError(f"a 400 without the field's name: {error}")


@pytest.fixture(scope="module")
def document(proxy: HttpProxy) -> dict[str, Any]:  # noqa: F811
    answer = requests.get(f"http://{proxy.host}:{proxy.port}/openapi.json", timeout=10)
    assert answer.status_code == 200
    document: dict[str, Any] = answer.json()
    return document


@pytest.fixture(scope="module")
def session(proxy: HttpProxy) -> Iterator[requests.Session]:  # noqa: F811
    with requests.Session() as s:
        s.headers["Authorization"] = f"Bearer {proxy.key}"
        yield s


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_the_api_fuzzed_from_its_own_document(proxy: HttpProxy, document: dict[str, Any],  # noqa: F811
                                              session: requests.Session, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_dict(document)
    schema.config.generation.update(modes=[mode])
    base = f"http://{proxy.host}:{proxy.port}"
    ran = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        strategy = operation.as_strategy(generation_mode=mode)

        @settings(max_examples=60, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=strategy)
        def run(case: Any) -> None:
            case.call_and_validate(base_url=base, session=session, checks=CHECKS,
                                   additional_checks=[names_the_field], timeout=15)

        try:
            run()
        except SkipTest:  # nothing of this operation can be broken (GET /health, GET /v1/models): none to send
            assert mode is GenerationMode.NEGATIVE, operation.label
            continue
        ran += 1
    assert ran >= (len(document["paths"]) if mode is GenerationMode.POSITIVE else 2)  # the operations fuzzed
    assert requests.get(f"{base}/health", timeout=10).status_code == 200  # the proxy is still up
