from datetime import timedelta
from pathlib import Path

import pytest

from trailbound import config
from trailbound.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "include" / "config" / "trailbound.yaml"


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "trailbound.yaml"
    path.write_text(text)
    return path


def test_the_documented_example_loads_and_resolves_paths_against_home(monkeypatch):
    monkeypatch.delenv(config.HOME_ENV, raising=False)
    loaded = config.load(EXAMPLE)
    assert loaded.home == REPO
    assert loaded.archive_dir("simdb") == REPO / "var" / "demo" / "archive"  # names are case-insensitive
    assert loaded.metadata.dsn_env == "TRAILBOUND_METADATA_DSN"


def test_a_misspelt_option_is_named(tmp_path):
    path = write(tmp_path, "sources:\n  SRC:\n    altarchivelogdst: /x\n")
    with pytest.raises(ConfigError) as error:
        config.load(path)
    message = str(error.value)
    assert str(path) in message
    assert "sources.SRC.altarchivelogdst: unknown option" in message
    assert "sources.SRC.altarchivelogdest: required option is missing" in message


def test_a_bad_group_name_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"sources\.TOO_LONG_NAME: a name is a letter then up to 7"):
        config.load(write(tmp_path, "sources:\n  TOO_LONG_NAME:\n    altarchivelogdest: /x\n"))


def test_no_secret_keys_are_accepted(tmp_path):
    text = "metadata:\n  dsn: postgresql://u:secret@h/db\n  conn_id: m\n  dsn_env: X\nsources:\n  S:\n    altarchivelogdest: a\n"
    with pytest.raises(ConfigError, match=r"metadata\.dsn: unknown option"):
        config.load(write(tmp_path, text))


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(write(tmp_path, "sources: [\n"))


@pytest.mark.parametrize("text,expected", [("20m", timedelta(minutes=20)), ("4h", timedelta(hours=4)),
                                           ("96H", timedelta(hours=96)), ("90s", timedelta(seconds=90)),
                                           ("2d", timedelta(days=2))])
def test_durations_in_goldengate_style(text, expected):
    assert config.parse_duration(text) == expected


def test_a_bad_duration_says_what_is_expected():
    with pytest.raises(ValueError, match="like 20m, 4h or 2d"):
        config.parse_duration("four hours")


def test_a_failure_callback_must_be_a_dotted_path(tmp_path):
    with pytest.raises(ConfigError, match=r"airflow\.on_failure_callbacks: .*'alerts/page.py' is not a dotted path"):
        config.load(write(tmp_path, "airflow:\n  on_failure_callbacks: [alerts/page.py]\n"))
    none = write(tmp_path, "sources:\n  SRC:\n    altarchivelogdest: /x\nairflow:\n  on_failure_callbacks: []\n")
    assert config.load(none).airflow.on_failure_callbacks == ()


def test_a_br_directory_is_refused_only_when_its_own_name_says_tmp(tmp_path):
    base = "sources:\n  SRC:\n    altarchivelogdest: archive\nextracts:\n  EXT1:\n    source: SRC\n" \
           "    exttrail: dirdat/lt\n    table: ['shop.*']\n    br:\n      brdir: {}\n"
    loaded = config.load(write(tmp_path, base.format("/var/tmp/trailbound/br")))
    assert loaded.extract("EXT1").br.brdir == Path("/var/tmp/trailbound/br")  # a parent named tmp is fine
    with pytest.raises(ConfigError) as error:
        config.load(write(tmp_path, base.format("/srv/trailbound/brtemp")))
    assert "extracts.EXT1.br.brdir" in str(error.value) and "must not contain temp or tmp" in str(error.value)


def test_a_command_line_that_does_not_parse_exits_2_as_the_readme_says(capsys):
    from trailbound import cli

    with pytest.raises(SystemExit) as usage:
        cli.main(["info", "extract"])
    assert usage.value.code == 2 and "usage:" in capsys.readouterr().err
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "a command line that does not parse prints its usage and exits with status 2" in readme
