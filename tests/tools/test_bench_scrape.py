"""The scrape bench runs, reads the same samples as the parser it replaced, and writes its figures."""

from __future__ import annotations

import json

from tools.bench import scrape


def test_the_scrape_bench_writes_its_figures(tmp_path) -> None:
    out = tmp_path / "scrape.json"
    assert scrape.main(["--models", "2", "--repeats", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert [p["page"] for p in result["pages"]] == ["triton", "batch", "vllm"]
    for page in result["pages"]:
        assert page["samples"] > 0 and page["new_whole_us"] > 0
        if result["old_rev"] is not None:  # a checkout with the history: both parsers read the same samples
            assert page["same_samples_whole"] and page["same_samples_read"]
