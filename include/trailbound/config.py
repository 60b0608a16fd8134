"""The configuration file: one YAML document describing sources and groups.

Options are named after the GoldenGate parameters they mirror (ALTARCHIVELOGDEST,
EXTTRAIL, TABLE, BR BRINTERVAL ...), in lower case. The file holds no secrets: database
DSNs come from environment variables (or Airflow connections, in the DAGs), and the
file only names which variable to read.

Relative paths are resolved against `home`, like GoldenGate resolves ./dirdat against
its installation directory; `home` itself is relative to the file's own directory.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from trailbound.errors import ConfigError

CONFIG_ENV = "TRAILBOUND_CONFIG"
HOME_ENV = "TRAILBOUND_HOME"
METADATA_DSN_ENV = "TRAILBOUND_METADATA_DSN"
TARGET_DSN_ENV = "TRAILBOUND_TARGET_DSN"

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)\s*$", re.IGNORECASE)
_UNIT = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(value: Any) -> timedelta:
    """'90s', '20m', '4h', '2d' -> timedelta (GoldenGate writes BRINTERVAL 4H)."""
    if isinstance(value, timedelta):
        return value
    match = _DURATION.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a duration like 20m, 4h or 2d")
    amount, unit = match.groups()
    return timedelta(**{_UNIT[unit.lower()]: float(amount)})


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]
_GROUP_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,7}$")


def _group_name(value: Any) -> str:
    if not isinstance(value, str) or not _GROUP_NAME.match(value):
        raise ValueError("a name is a letter then up to 7 letters, digits or _ (GoldenGate's group-name rule)")
    return value


GroupName = Annotated[str, BeforeValidator(_group_name)]


class _Section(BaseModel):
    # A misspelt option must fail loudly rather than silently keep its default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseConfig(_Section):
    """Where a database's DSN comes from: an environment variable, or (in Airflow) a
    connection id. Never the DSN itself."""

    dsn_env: str
    conn_id: str


class SourceConfig(_Section):
    """A source database, seen through its redo archive (the contract in
    docs/redo-archive.md)."""

    altarchivelogdest: Path  # TRANLOGOPTIONS ALTARCHIVELOGDEST: the archive directory


class ExtractConfig(_Section):
    """A capture group's parameters (an Extract parameter file)."""

    source: str                        # which source database's archive it reads
    exttrail: Path                     # EXTTRAIL: the trail prefix; files are <prefix><9-digit seqno>
    table: list[str] = Field(min_length=1)  # TABLE: schema.table names, * and ? as wildcards
    megabytes: float = Field(default=100, gt=0)  # ADD EXTTRAIL ... MEGABYTES: trail file rollover size
    begin: str = "earliest"            # ADD EXTRACT ... BEGIN, used when a run finds the group not added

    @field_validator("table")
    @classmethod
    def _tables_are_qualified(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if "." not in pattern:
                raise ValueError(f"{pattern!r} must be schema.table (wildcards allowed: shop.*)")
        return value


class Config(_Section):
    home: Path = Path(".")
    metadata: DatabaseConfig = DatabaseConfig(dsn_env=METADATA_DSN_ENV, conn_id="trailbound_metadata")
    target: DatabaseConfig = DatabaseConfig(dsn_env=TARGET_DSN_ENV, conn_id="trailbound_target")
    sources: dict[GroupName, SourceConfig] = Field(min_length=1)
    extracts: dict[GroupName, ExtractConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _extracts_name_configured_sources(self) -> "Config":
        for name, extract in self.extracts.items():
            if extract.source.upper() not in {s.upper() for s in self.sources}:
                raise ValueError(f"extract {name} reads source {extract.source!r}, which is not configured")
        return self

    @field_validator("sources")
    @classmethod
    def _names_are_case_insensitive(cls, value: dict) -> dict:
        upper = [name.upper() for name in value]
        if len(set(upper)) != len(upper):
            raise ValueError("names differ only in case; GoldenGate group names are case-insensitive")
        return value

    def path(self, value: Path) -> Path:
        """A configured path made absolute against `home`."""
        return value if value.is_absolute() else (self.home / value).resolve()

    def source_name(self, name: str | None = None) -> str:
        """The configured spelling of a source name (names are case-insensitive, like
        GoldenGate's); None means the only source configured."""
        if name is None:
            if len(self.sources) == 1:
                return next(iter(self.sources))
            raise ConfigError(f"several sources are configured ({', '.join(self.sources)}): name one")
        for key in self.sources:
            if key.upper() == name.upper():
                return key
        raise ConfigError(f"no source named {name!r}; configured: {', '.join(self.sources)}")

    def source(self, name: str | None = None) -> SourceConfig:
        return self.sources[self.source_name(name)]

    def extract_name(self, name: str) -> str:
        for key in self.extracts:
            if key.upper() == name.upper():
                return key
        raise ConfigError(f"no extract named {name!r} in the configuration; configured: "
                          f"{', '.join(self.extracts) or 'none'}")

    def extract(self, name: str) -> ExtractConfig:
        return self.extracts[self.extract_name(name)]

    def archive_dir(self, source: str | None = None) -> Path:
        return self.path(self.source(source).altarchivelogdest)


def _describe(error: dict) -> str:
    key = ".".join(str(part) for part in error["loc"] if part != "[key]") or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"{key}: unknown option"
    if kind == "missing":
        return f"{key}: required option is missing"
    message = error["msg"].removeprefix("Value error, ")
    return f"{key}: {message} (got {error.get('input')!r})"


def load(path: str | os.PathLike | None = None) -> Config:
    """Load and validate the configuration file. Raises ConfigError naming the file and
    every invalid key."""
    path = Path(path or os.environ.get(CONFIG_ENV) or "trailbound.yaml")
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: the configuration must be a mapping of options")
    try:
        config = Config.model_validate(document)
    except ValidationError as exc:
        problems = "\n  ".join(_describe(error) for error in exc.errors())
        raise ConfigError(f"{path}: invalid configuration\n  {problems}") from None
    home = Path(os.environ.get(HOME_ENV) or (path.resolve().parent / config.home)).resolve()
    return config.model_copy(update={"home": home})
