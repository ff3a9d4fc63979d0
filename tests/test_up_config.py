"""The config file ``ferry up`` writes from the user's ``--config``: tomllib reads back what was meant."""

import tomllib

from ferry.cli.up.main import write_config
from ferry.config import parse


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
