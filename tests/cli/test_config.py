"""placer.cli.config: where defaults come from (file found upward, environment, built-in) and
the errors a bad config file or variable gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from placer.cli.config import (
    SETTINGS,
    SOURCE_BUILT_IN,
    SOURCE_ENV,
    SOURCE_FILE,
    ConfigError,
    find_config_file,
    load_config,
    read_config_file,
    read_environment,
)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project folder ``proj`` with a working folder ``proj/a/b`` two levels below it;
    no config file yet."""
    (tmp_path / "proj" / "a" / "b").mkdir(parents=True)
    return tmp_path / "proj"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_placer_toml_is_found_from_a_folder_below(project):
    toml = _write(project / "placer.toml", 'topology = "4x-dgx-h100"\njobs = 8\n')
    config = load_config(project / "a" / "b", environ={})
    assert config.file == toml.resolve() and config.table == ""
    assert config.defaults["topology"].value == "4x-dgx-h100"
    assert (config.defaults["jobs"].value, config.defaults["jobs"].source) == (8, SOURCE_FILE)
    assert config.defaults["jobs"].where == str(toml.resolve())
    assert config.defaults["model"].source == SOURCE_BUILT_IN
    assert config.defaults["model"].value is None


def test_pyproject_without_the_table_is_passed_over(project):
    """A pyproject.toml of another tool does not stop the search; one with [tool.placer]
    does, and placer.toml wins over it within one folder."""
    _write(project / "a" / "pyproject.toml", '[tool.ruff]\nline-length = 100\n')
    outer = _write(project / "pyproject.toml", '[tool.placer]\nmodel = "deepseek-v3"\n')
    assert find_config_file(project / "a" / "b") == (outer, "tool.placer")
    assert load_config(project / "a" / "b", environ={}).defaults["model"].value == "deepseek-v3"
    inner = _write(project / "a" / "placer.toml", 'model = "kimi-k2"\n')
    _write(project / "a" / "pyproject.toml", '[tool.placer]\nmodel = "qwen3-30b-a3b"\n')
    assert find_config_file(project / "a" / "b") == (inner, "")


def test_no_file_means_every_default_is_built_in(project):
    config = load_config(project / "a" / "b", environ={})
    assert config.file is None
    assert {d.source for d in config.defaults.values()} == {SOURCE_BUILT_IN}
    assert list(config.defaults) == list(SETTINGS)


def test_environment_wins_over_the_file(project):
    _write(project / "placer.toml", 'topology = "dgx-h100"\nmodel = "deepseek-v3"\n')
    config = load_config(project, environ={"PLACER_TOPOLOGY": "gb200-nvl72", "PLACER_JOBS": "4",
                                           "PLACER_DEBUG": "1", "PLACER_MODEL": ""})
    assert (config.defaults["topology"].value, config.defaults["topology"].source) == (
        "gb200-nvl72", SOURCE_ENV)
    assert config.defaults["topology"].origin() == "PLACER_TOPOLOGY=gb200-nvl72"
    assert config.defaults["jobs"].value == 4
    # an empty variable is not given: the file's value stands
    assert config.defaults["model"].source == SOURCE_FILE
    assert config.defaults["model"].origin() == f"{project / 'placer.toml'}: model"
    assert set(config.given()) == {"topology", "jobs", "model"}


def test_keys_take_dashes_or_underscores_and_ints_serve_as_floats(project):
    toml = _write(project / "placer.toml", "kv-reserve-gb = 40\nseed = 3\n")
    assert read_config_file(toml) == {"kv_reserve_gb": 40.0, "seed": 3}
    assert isinstance(read_config_file(toml)["kv_reserve_gb"], float)


def test_unknown_key_names_the_file_and_the_closest_setting(project):
    toml = _write(project / "placer.toml", 'topolgy = "dgx-h100"\n')
    with pytest.raises(ConfigError) as info:
        load_config(project, environ={})
    assert str(info.value) == f"{toml}: unknown setting 'topolgy'"
    assert info.value.hint.startswith("did you mean topology? (settings: topology, model,")
    assert info.value.exit_code == 2


def test_unknown_key_in_pyproject_names_the_table(project):
    toml = _write(project / "pyproject.toml", '[tool.placer]\nthreads = 8\n')
    with pytest.raises(ConfigError) as info:
        load_config(project, environ={})
    assert str(info.value) == f"{toml}: unknown setting [tool.placer] 'threads'"
    assert info.value.hint.startswith("settings: topology, model")


@pytest.mark.parametrize(("text", "message"), [
    ('jobs = "four"\n', "jobs: expected a whole number, got 'four'"),
    ("jobs = true\n", "jobs: expected a whole number, got True"),
    ("topology = 8\n", "topology: expected a string, got 8"),
    ("kv_reserve_gb = nan\n", "kv_reserve_gb: expected a finite number, got nan"),
    ("kv_reserve_gb = inf\n", "kv_reserve_gb: expected a finite number, got inf"),
    ('model = "  "\n', "model: expected a value, got an empty string"),
])
def test_wrong_values_in_the_file(project, text, message):
    toml = _write(project / "placer.toml", text)
    with pytest.raises(ConfigError) as info:
        load_config(project, environ={})
    assert str(info.value) == f"{toml}: {message}"


@pytest.mark.parametrize(("environ", "message"), [
    ({"PLACER_JOBS": "four"}, "PLACER_JOBS: expected a whole number, got 'four'"),
    ({"PLACER_JOBS": "2.5"}, "PLACER_JOBS: expected a whole number, got '2.5'"),
    ({"PLACER_KV_RESERVE_GB": "nan"}, "PLACER_KV_RESERVE_GB: expected a finite number, got nan"),
    ({"PLACER_KV_RESERVE_GB": "-inf"},
     "PLACER_KV_RESERVE_GB: expected a finite number, got -inf"),
])
def test_wrong_values_in_the_environment(environ, message):
    with pytest.raises(ConfigError) as info:
        read_environment(environ)
    assert str(info.value) == message


def test_malformed_toml_names_the_file(project):
    toml = _write(project / "placer.toml", "topology = \n")
    with pytest.raises(ConfigError) as info:
        load_config(project, environ={})
    assert str(info.value).startswith(f"{toml}: not valid TOML: ")


def test_every_setting_names_its_option_and_variable():
    setting = SETTINGS["kv_reserve_gb"]
    assert (setting.option, setting.env) == ("--kv-reserve-gb", "PLACER_KV_RESERVE_GB")
    assert all(s.kind in (str, int, float) and s.help for s in SETTINGS.values())
