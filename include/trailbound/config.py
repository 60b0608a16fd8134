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
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

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


def _qualified_patterns(value: list[str]) -> list[str]:
    for pattern in value:
        if "." not in pattern:
            raise ValueError(f"{pattern!r} must be schema.table (wildcards allowed: shop.*)")
    return value


# TABLE: schema.table names, * and ? as wildcards.
TablePatterns = Annotated[list[str], AfterValidator(_qualified_patterns)]


class _Section(BaseModel):
    # A misspelt option must fail loudly rather than silently keep its default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseConfig(_Section):
    """Where a database's DSN comes from: an environment variable, or (in Airflow) a
    connection id. Never the DSN itself."""

    dsn_env: str
    conn_id: str


class SegmentLimits(_Section):
    """When the PostgreSQL miner closes a segment: whichever limit comes first."""

    records: int = Field(default=100_000, ge=1)
    bytes: int = Field(default=64 << 20, ge=1)  # about this much row data; 64M, 1G ... accepted
    seconds: float = Field(default=900, gt=0)    # of log time (the records' ts)

    @field_validator("bytes", mode="before")
    @classmethod
    def _size(cls, value: Any) -> Any:
        return parse_size(value)


_SLOT_NAME = re.compile(r"^[a-z0-9_]{1,63}$")


class PostgresSourceConfig(_Section):
    """A live PostgreSQL source whose WAL `trailbound archive pull` archives through a
    logical replication slot (docs/live-postgres.md)."""

    dsn_env: str                       # environment variable holding the source's DSN
    conn_id: str                       # Airflow connection the DAGs use instead
    slot: str                          # the logical replication slot (pgoutput) the pulls read
    publication: str                   # the publication holding the tables
    table: TablePatterns = Field(min_length=1)  # what the publication holds
    segment: SegmentLimits = SegmentLimits()

    @field_validator("slot")
    @classmethod
    def _slot_name(cls, value: str) -> str:
        if not _SLOT_NAME.match(value):
            raise ValueError("a slot name is 1 to 63 lower-case letters, digits or _ (PostgreSQL's rule)")
        return value

    @field_validator("publication")
    @classmethod
    def _publication_name(cls, value: str) -> str:
        if not 1 <= len(value) <= 63:
            raise ValueError("a publication name is 1 to 63 characters")
        return value


class SourceConfig(_Section):
    """A source database, seen through its redo archive (the contract in
    docs/redo-archive.md)."""

    altarchivelogdest: Path  # TRANLOGOPTIONS ALTARCHIVELOGDEST: the archive directory
    truth: Path | None = None  # the simulator's expected final state, for the replica check (demo, tests)
    postgres: PostgresSourceConfig | None = None  # a live PostgreSQL source: its miner writes the archive


_BR_MIN, _BR_MAX = timedelta(minutes=20), timedelta(hours=96)


class BoundedRecoveryConfig(_Section):
    """BR: persist long-running open transactions so that a restart re-reads at most two
    BR intervals of log (docs/bounded-recovery.md)."""

    brdir: Path = Path("var/br")          # parent directory; each group gets BRDIR/<group>/
    brinterval: Duration = timedelta(hours=4)  # 20m to 96h, rounded up to a multiple of the extract's interval
    broff: bool = False                   # no Bounded Recovery at all
    broffonfailure: bool = False          # after a BR failure, stay on normal recovery
    brkeepstalefiles: bool = False        # keep superseded persisted files

    @field_validator("brdir")
    @classmethod
    def _not_a_temporary_directory(cls, value: Path) -> Path:
        # Only the directory's own name: a tmp directory is what cleaners empty, not a path under one.
        if re.search("te?mp", value.name, re.IGNORECASE):
            raise ValueError("a BR directory name must not contain temp or tmp: such directories get cleaned up")
        return value

    @field_validator("brinterval")
    @classmethod
    def _within_goldengate_limits(cls, value: timedelta) -> timedelta:
        if not _BR_MIN <= value <= _BR_MAX:
            raise ValueError("brinterval must be between 20m and 96h")
        return value


class LongTransactionConfig(_Section):
    """WARNLONGTRANS: warn about transactions open longer than `duration` (log time),
    checking at most every `checkinterval`."""

    duration: Duration = timedelta(hours=1)
    checkinterval: Duration = timedelta(minutes=5)


class ExtractConfig(_Section):
    """A capture group's parameters (an Extract parameter file)."""

    source: str                        # which source database's archive it reads
    exttrail: Path                     # EXTTRAIL: the trail prefix; files are <prefix><9-digit seqno>
    table: TablePatterns = Field(min_length=1)
    megabytes: float = Field(default=100, gt=0)  # ADD EXTTRAIL ... MEGABYTES: trail file rollover size
    begin: str = "earliest"            # ADD EXTRACT ... BEGIN, used when a run finds the group not added
    interval: Duration = timedelta(minutes=15)  # how often capture runs (its Airflow schedule)
    br: BoundedRecoveryConfig = BoundedRecoveryConfig()
    warnlongtrans: LongTransactionConfig = LongTransactionConfig()

    @property
    def effective_brinterval(self) -> timedelta:
        """BRINTERVAL rounded up to a whole number of capture intervals."""
        runs = -(-self.br.brinterval // self.interval)  # ceiling division of timedeltas
        return runs * self.interval


class PumpConfig(_Section):
    """A data pump's parameters: the trail it reads and the remote trail it writes
    (docs/pump.md). Without `table` it runs PASSTHRU: files are shipped byte for byte."""

    exttrail: str                      # EXTTRAILSOURCE: the trail it reads (a path, or a URI)
    rmttrail: str                      # RMTTRAIL: the remote trail prefix, a path or Hadoop-compatible URI
    table: TablePatterns | None = Field(default=None, min_length=1)  # keep only these; absent: PASSTHRU

    @field_validator("exttrail", "rmttrail")
    @classmethod
    def _names_a_file_prefix(cls, value: str) -> str:
        if not value.strip() or value.endswith("/"):
            raise ValueError("a trail is a directory plus a file-name prefix, like var/dirdat/rt")
        return value


_MAP_NAME = re.compile(r"^[^.]+\.[^.].*$")


class MapRule(_Section):
    """MAP source, TARGET target: source tables (`*` and `?` wildcards, schema.table) to
    target tables. In `target`, a part that is `*` takes the source's schema or table
    name; any other part is the name itself. The first rule that matches a table wins."""

    source: str
    target: str

    @field_validator("source", "target")
    @classmethod
    def _qualified(cls, value: str) -> str:
        if not _MAP_NAME.match(value):
            raise ValueError(f"{value!r} must be schema.table (wildcards allowed: shop.*)")
        return value

    @field_validator("target")
    @classmethod
    def _whole_part_wildcards(cls, value: str) -> str:
        for part in value.split(".", 1):
            if part != "*" and any(c in part for c in "*?"):
                raise ValueError(f"{value!r}: in a target, a wildcard stands for a whole schema or table name (*)")
        return value


class DdlConfig(_Section):
    """How replicat follows a source table's new version (replicat/ddl.py, docs/replicat.md
    "When a source table changes"): `apply` adds new nullable or defaulted columns, widens
    types, creates new tables a MAP selects, and stops before anything else; `abend`
    stops before any change."""

    mode: Literal["apply", "abend"] = "apply"
    drop_columns: Literal["keep", "drop"] = "keep"   # a column dropped at the source: kept on the target, or dropped


_SQLSTATE = re.compile(r"^[0-9A-Z]{2}(?:[0-9A-Z]{3})?$")
RepErrorAction = Literal["abend", "discard", "ignore", "retryop", "transabend", "transdiscard"]


class RepErrorRule(_Section):
    """REPERROR: what replicat does when the target refuses an operation with this
    SQLSTATE (a five-character code, or its two-character class), optionally only for
    the source tables `map` selects; `{default: ACTION}` covers every other error.
    The most specific rule wins: a MAP rule over a global one, then code over class over
    default (replicat/reperror.py, docs/replicat.md "REPERROR")."""

    sqlstate: str | None = None
    default: RepErrorAction | None = None
    action: RepErrorAction | None = None
    map: str | None = None             # source tables (schema.table, `*` and `?`), as in MAP
    retries: int | None = Field(default=None, ge=1)   # retryop: attempts after the first
    delay: Duration = timedelta(0)     # retryop: the wait before each attempt again

    @field_validator("sqlstate", mode="before")
    @classmethod
    def _sqlstate(cls, value: Any) -> Any:
        if value is None:
            return None
        text = str(value).strip().upper()
        if not _SQLSTATE.match(text):
            raise ValueError(f"{value!r} is not a SQLSTATE: five characters (23505) or a two-character class (23)")
        return text

    @field_validator("map")
    @classmethod
    def _qualified(cls, value: str | None) -> str | None:
        if value is not None and not _MAP_NAME.match(value):
            raise ValueError(f"{value!r} must be schema.table (wildcards allowed: shop.*)")
        return value

    @model_validator(mode="after")
    def _one_rule(self) -> "RepErrorRule":
        if (self.sqlstate is None) == (self.default is None):
            raise ValueError("a reperror rule is {sqlstate: CODE, action: ACTION} or {default: ACTION}")
        if self.default is not None and self.action is not None:
            raise ValueError("a default rule names its action as `default: ACTION`, without `action`")
        if self.sqlstate is not None and self.action is None:
            raise ValueError(f"reperror rule for SQLSTATE {self.sqlstate} names no action")
        if (self.resolved == "retryop") != (self.retries is not None):
            raise ValueError("`retries: N` goes with action retryop, and only with it")
        if self.delay and self.resolved != "retryop":
            raise ValueError("`delay` goes with action retryop only")
        return self

    @property
    def resolved(self) -> str:
        """The rule's action, whichever way it was written."""
        return self.action or self.default


class ReplicatConfig(_Section):
    """A replicat group's parameters (a Replicat parameter file): the trail it applies to
    the target database, how source tables map to target tables, and how it groups
    source transactions into target transactions (docs/replicat.md)."""

    exttrail: str                      # EXTTRAIL: the trail it reads (a local trail, or a pump's remote trail)
    source: str                        # the source whose defs.json describes the trail's tables
    map: list[MapRule] = Field(default_factory=lambda: [MapRule(source="*.*", target="*.*")], min_length=1)
    grouptransops: int = Field(default=1000, ge=1)  # GROUPTRANSOPS: operations per target transaction (at least)
    handlecollisions: bool = False     # HANDLECOLLISIONS: duplicate insert -> update; missing row -> skip, logged
    # APPLY_PARALLELISM: target sessions applying insert-only groups at once, committed in
    # trail order (replicat/apply/parallel.py); 1 applies every group on the run's one session.
    apply_parallelism: int = Field(default=2, ge=1, le=16)
    # The most trail records replicat prepares at once (a chunk; up to three are in memory:
    # one applied, two prepared ahead). A source transaction longer than this is applied in
    # pieces of this many records, all inside its one target transaction (docs/replicat.md).
    chunk_records: int = Field(default=250_000, ge=1)
    checkpointtable: str = "trailbound.ggcheckpoint"  # CHECKPOINTTABLE [schema.]name in the target
    ddl: DdlConfig = Field(default_factory=DdlConfig)  # a source table's new version: see DdlConfig
    # REPERROR: what a target error does to an operation (default: abend, stop the run);
    # see RepErrorRule and docs/replicat.md "REPERROR and discards".
    reperror: list[RepErrorRule] = Field(default_factory=list)
    # DISCARDFILE: the directory of each run's readable discard file (<group>_<start>.dsc);
    # the discard table in the target is the record, the file a view of it.
    discarddir: Path = Path("var/dirdsc")

    @field_validator("exttrail")
    @classmethod
    def _names_a_file_prefix(cls, value: str) -> str:
        if not value.strip() or value.endswith("/"):
            raise ValueError("a trail is a directory plus a file-name prefix, like var/dirdat/lt")
        return value

    @field_validator("checkpointtable")
    @classmethod
    def _table_name(cls, value: str) -> str:
        if not value.strip() or value.startswith(".") or value.endswith("."):
            raise ValueError("a checkpoint table is [schema.]name")
        return value


class PurgeOldExtractsConfig(_Section):
    """PURGEOLDEXTRACTS ... USECHECKPOINTS: trail files go once every reader has passed
    them, and only if older than `minkeephours` and not among the newest `minkeepfiles`."""

    minkeephours: float = Field(default=0, ge=0)
    minkeepfiles: int = Field(default=1, ge=0)


class AirflowConfig(_Section):
    """What `trailbound dags generate` writes into the DAG files."""

    start_date: datetime = datetime(2026, 11, 1, tzinfo=timezone.utc)  # first data interval of every schedule
    retention_interval: Duration = timedelta(hours=4)                  # how often the retention DAG runs
    compare_interval: Duration = timedelta(days=1)                     # how often a live source's compare DAG runs
    # Called when any run of a trailbound DAG fails (the long-transaction monitor's alert
    # among them): dotted paths to functions or notifier instances importable in Airflow.
    on_failure_callbacks: tuple[str, ...] = ("trailbound_airflow.alerts.log_alert",)
    # What the long-transaction monitor alerts through besides its log line: dotted paths
    # to your notifier instances (Slack, e-mail, ...); the message is {{ trailbound_alert }}.
    alert_notifiers: tuple[str, ...] = ()

    @field_validator("on_failure_callbacks", "alert_notifiers")
    @classmethod
    def _dotted_paths(cls, paths: tuple[str, ...]) -> tuple[str, ...]:
        for path in paths:
            if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", path):
                raise ValueError(f"{path!r} is not a dotted path to a callable (package.module.name)")
        return paths


_SIZE = re.compile(r"^\s*(\d+)\s*([KMGT]?)B?\s*$", re.IGNORECASE)


def parse_size(value: Any) -> int | None:
    """maxbytes: a byte count, or 500M / 20G / 1T (powers of 1024, like RMAN's sizes)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    match = _SIZE.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a size like 1073741824, 500M or 20G")
    amount, unit = match.groups()
    return int(amount) * 1024 ** "_KMGT".index(unit.upper() or "_")


class RetentionConfig(_Section):
    """Archive-log retention (docs/retention.md): RMAN's archivelog deletion policy made
    capture-aware, as REGISTER EXTRACT ... LOGRETENTION makes it in Oracle. A segment goes
    once every registered capture is past it, and only if these allow it too. They apply
    to each source's archive separately."""

    minkeephours: float = Field(default=8, ge=0)   # keep the newest N hours of log (log time); advice: 2 x brinterval
    backedup: int = Field(default=0, ge=0)          # BACKED UP n TIMES: keep until marked backed up n times
    maxbytes: Annotated[int | None, BeforeValidator(parse_size)] = None  # space limit of an archive
    #   (db_recovery_file_dest_size): over it, the oldest segments go even if a capture needs them

    @field_validator("maxbytes")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError("maxbytes must be a positive size (or absent: no space limit)")
        return value


class Config(_Section):
    home: Path = Path(".")
    metadata: DatabaseConfig = DatabaseConfig(dsn_env=METADATA_DSN_ENV, conn_id="trailbound_metadata")
    target: DatabaseConfig = DatabaseConfig(dsn_env=TARGET_DSN_ENV, conn_id="trailbound_target")
    sources: dict[GroupName, SourceConfig] = Field(min_length=1)
    airflow: AirflowConfig = AirflowConfig()
    extracts: dict[GroupName, ExtractConfig] = Field(default_factory=dict)
    pumps: dict[GroupName, PumpConfig] = Field(default_factory=dict)
    replicats: dict[GroupName, ReplicatConfig] = Field(default_factory=dict)
    purgeoldextracts: PurgeOldExtractsConfig = PurgeOldExtractsConfig()
    retention: RetentionConfig = RetentionConfig()

    @model_validator(mode="after")
    def _pumps_are_extract_groups(self) -> "Config":
        # In GoldenGate a pump is an Extract group: one name space, case-insensitive.
        names = [name.upper() for name in [*self.extracts, *self.pumps]]
        if len(set(names)) != len(names):
            raise ValueError("pump and extract names must differ (case-insensitively): a pump is an extract group")
        for name, pump in self.pumps.items():
            if pump.exttrail == pump.rmttrail:
                raise ValueError(f"pump {name} would write the trail it reads ({pump.rmttrail})")
        remote = [pump.rmttrail for pump in self.pumps.values()]
        if len(set(remote)) != len(remote):
            raise ValueError("two pumps write the same rmttrail; each remote trail has one writer")
        return self

    @model_validator(mode="after")
    def _replicats_read_configured_sources(self) -> "Config":
        names = [name.upper() for name in self.replicats]
        if len(set(names)) != len(names):
            raise ValueError("replicat names differ only in case; GoldenGate group names are case-insensitive")
        for name, replicat in self.replicats.items():
            if replicat.source.upper() not in {s.upper() for s in self.sources}:
                raise ValueError(f"replicat {name} reads source {replicat.source!r}, which is not configured")
        return self

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

    def postgres(self, name: str | None = None) -> PostgresSourceConfig:
        """A source's postgres: block; a ConfigError when it has none."""
        source = self.source_name(name)
        block = self.sources[source].postgres
        if block is None:
            raise ConfigError(f"source {source} has no postgres: block: its archive is written by another tool")
        return block

    def archive_dir(self, source: str | None = None) -> Path:
        return self.path(self.source(source).altarchivelogdest)

    def pump_name(self, name: str) -> str:
        for key in self.pumps:
            if key.upper() == name.upper():
                return key
        raise ConfigError(f"no pump named {name!r} in the configuration; configured: {', '.join(self.pumps) or 'none'}")

    def pump(self, name: str) -> PumpConfig:
        return self.pumps[self.pump_name(name)]

    def replicat_name(self, name: str) -> str:
        for key in self.replicats:
            if key.upper() == name.upper():
                return key
        raise ConfigError(f"no replicat named {name!r} in the configuration; configured: "
                          f"{', '.join(self.replicats) or 'none'}")

    def replicat(self, name: str) -> ReplicatConfig:
        return self.replicats[self.replicat_name(name)]

    def trail_location(self, value: str | Path) -> str:
        """A configured trail prefix as the metadata store keys it (trail_file.trail,
        trail_reader.trail): a plain path or file: URI becomes the absolute path `path()`
        gives, so capture, pump, replicat and purge agree; any other URI stays as written."""
        from trailbound import files as trailfs

        text = str(value)
        return str(self.path(trailfs.local_path(text))) if trailfs.is_local(text) else text


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
