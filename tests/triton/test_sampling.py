"""Sampling parameters through ``ferry up --triton`` to a real Triton model's inputs, with the openai client."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from ferry.procs import Child
from tools.triton import launch
from tools.triton.launch import TritonEnvironmentMissing, TritonProcess, start_triton

pytestmark = [pytest.mark.triton, pytest.mark.timeout(180)]

SCRIPT = Path(__file__).with_name("sampling_serve.py")


@pytest.fixture
def sampling_triton(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TritonProcess]:
    monkeypatch.setattr(launch, "SERVE_SCRIPT", SCRIPT)
    try:
        server = start_triton(tmp_path / "triton")
    except TritonEnvironmentMissing as exc:
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()


def test_sampling_parameters_reach_the_model_inputs(tmp_path: Path, sampling_triton: TritonProcess) -> None:
    server = sampling_triton
    up = Child("up", ["up", "--triton", f"{server.grpc},{server.metrics_url}", "--workdir", str(tmp_path / "f")],
               tmp_path).start()
    try:
        ready = up.wait_ready(90)
        key = next(iter(ready["api_keys"].values()))
        client = openai.OpenAI(base_url=f"http://{ready['http']}/v1", api_key=key, max_retries=0, timeout=30)
        assert "llm-sampling" in [m.id for m in client.models.list()]
        answer = client.completions.create(model="llm-sampling", prompt="hello", max_tokens=4, temperature=0.25,
                                           seed=7, stop=["END", "zz"], extra_body={"top_k": 3})
        assert json.loads(answer.choices[0].text) == {"temperature": 0.25, "top_k": 3, "random_seed": 7,
                                                      "stop_words": ["END", "zz"]}
        plain = client.completions.create(model="llm-sampling", prompt="hello", max_tokens=4)
        assert json.loads(plain.choices[0].text) == {}  # nothing given, nothing sent: the model's defaults
        with pytest.raises(openai.BadRequestError) as refused:  # the model declares no frequency_penalty
            client.completions.create(model="llm-sampling", prompt="hello", max_tokens=4, frequency_penalty=0.5)
        assert refused.value.body["param"] == "frequency_penalty"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as unary:  # llm-unary declares no sampling input at all
            client.completions.create(model="llm-unary", prompt="hello", max_tokens=4, temperature=0.5)
        assert unary.value.body["param"] == "temperature"  # type: ignore[index]
        text = client.completions.create(model="llm-unary", prompt="hello", max_tokens=4).choices[0].text
        assert len(text.split()) == 4
    finally:
        up.stop()
