"""The config file ``ferry up`` writes from the user's ``--config``: tomllib reads back what was meant."""

import argparse
import tomllib

from agent.replica.engine import EngineParams
from ferry.config import parse
from ferry_cli.up.main import ANSWER_TOKENS, add_arguments, write_config


def test_a_config_with_non_ascii_strings_round_trips(tmp_path):
    user = tmp_path / "user.toml"
    user.write_text(
        '[[models]]\nname = "gpu-😀"\ndefault_version = "v1"\n\n'
        '[controlplane]\ngrace_seconds = 2.0\n\n'
        '[proxy]\nregion = "région-東京"\n',
        encoding="utf-8",
    )
    written = tmp_path / "ferry.toml"
    config, keys = write_config(str(user), ["gpu-😀"], ["local"], written)
    back = tomllib.loads(written.read_text(encoding="utf-8"))
    assert back == config
    assert back["models"] == [{"name": "gpu-😀", "default_version": "v1"}]
    assert back["proxy"]["region"] == "région-東京"
    assert set(keys) == {t["name"] for t in back["tenants"]}  # made-up tenants, since the file named none
    parse(back)  # and the components accept it


def test_the_region_layout_round_trips(tmp_path):
    written = tmp_path / "ferry.toml"
    config, _ = write_config(None, ["chat-small"], ["a", "b", "c"], written)
    back = tomllib.loads(written.read_text(encoding="utf-8"))
    assert back == config
    assert back["controlplane"]["region_rtt_ms"] == {"a:b": 40.0, "a:c": 200.0, "b:c": 180.0}


def test_simulated_answers_end_naturally_unless_the_flag_or_the_file_says_otherwise(tmp_path):
    written = tmp_path / "ferry.toml"
    config, _ = write_config(None, ["chat"], ["local"], written)
    assert config["replica"] == {"answer_tokens": ANSWER_TOKENS}
    params = parse(tomllib.loads(written.read_text(encoding="utf-8"))).section(EngineParams, "replica")
    assert params.answer_tokens == ANSWER_TOKENS and params.answer_min_tokens == 8
    user = tmp_path / "user.toml"
    user.write_text("[replica]\nanswer_tokens = 100\nmax_running = 4\n", encoding="utf-8")
    config, _ = write_config(str(user), ["chat"], ["local"], written)
    assert config["replica"] == {"answer_tokens": 100, "max_running": 4}  # the file's own choice
    config, _ = write_config(str(user), ["chat"], ["local"], written, answer_tokens=0)
    assert config["replica"] == {"answer_tokens": 0, "max_running": 4}  # --answer-tokens 0: the flag wins
    assert parse(tomllib.loads(written.read_text(encoding="utf-8"))).section(EngineParams, "replica").answer_tokens == 0


def test_the_flag_parses_and_defaults_to_the_file():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert parser.parse_args([]).answer_tokens is None
    assert parser.parse_args(["--answer-tokens", "0"]).answer_tokens == 0
