"""A local model registry in one SQLite file, with the concepts of SageMaker's Model Registry.

Model package groups hold numbered model package versions (1, 2, 3, ... per group). Each version carries its model
data (a local model.tar.gz path or a URI), the inference image (informational), content and response types, instance
types, the metrics of evaluation.json, customer metadata, and an approval status that moves between
PendingManualApproval, Approved and Rejected. `ModelVersion.describe()` returns the shape of boto3's
`describe_model_package` answer, so code that prints or compares model packages handles both.

Every call opens its own connection and writes inside a `BEGIN IMMEDIATE` transaction: several processes (the local
runner registering a model while `models approve` runs in another shell) may use one file at once.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pipeline.config import METADATA_VALUE_LENGTH
from pipeline.config.aws import TAG_CHARACTERS, tag_text
from pipeline.errors import UserError
from pipeline.local.storage import LOCAL_ARN
from steps.contract import APPROVAL_STATUSES, APPROVED, REJECTED, report_accuracy

METADATA_ENTRIES, METADATA_KEY_LENGTH = 50, 128  # CustomerMetadataMap's limits (values: METADATA_VALUE_LENGTH)
_SCHEMA = """
CREATE TABLE IF NOT EXISTS model_package_groups (
    name        TEXT PRIMARY KEY,
    description TEXT NOT NULL DEFAULT '',
    created     TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS model_packages (
    group_name          TEXT NOT NULL REFERENCES model_package_groups(name),
    version             INTEGER NOT NULL,
    model_data          TEXT NOT NULL,
    image               TEXT NOT NULL DEFAULT '',
    content_types       TEXT NOT NULL DEFAULT '[]',
    response_types      TEXT NOT NULL DEFAULT '[]',
    inference_instances TEXT NOT NULL DEFAULT '[]',
    metrics             TEXT NOT NULL DEFAULT '{}',
    metrics_source      TEXT NOT NULL DEFAULT '',
    customer_metadata   TEXT NOT NULL DEFAULT '{}',
    environment         TEXT NOT NULL DEFAULT '{}',
    description         TEXT NOT NULL DEFAULT '',
    status              TEXT NOT NULL,
    note                TEXT NOT NULL DEFAULT '',
    created             TEXT NOT NULL,
    modified            TEXT NOT NULL,
    PRIMARY KEY (group_name, version)
);
"""


def _full(folder: Path) -> bool:
    return os.statvfs(folder).f_bavail == 0


def _read_only(folder: Path) -> bool:
    return bool(os.statvfs(folder).f_flag & os.ST_RDONLY)


class ModelNotFoundError(UserError, LookupError):
    """No such model package group or version."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def _check_status(status: str) -> str:
    if status not in APPROVAL_STATUSES:
        raise ValueError(f"invalid approval status {status!r}: expected one of {', '.join(APPROVAL_STATUSES)}")
    return status


@dataclass(frozen=True)
class ModelVersion:
    """One model package version. Times are UTC ISO-8601 strings."""

    group: str
    version: int
    model_data: str
    approval_status: str
    created: str
    modified: str
    image: str = ""
    content_types: tuple[str, ...] = ()
    response_types: tuple[str, ...] = ()
    inference_instances: tuple[str, ...] = ()
    metrics: dict[str, Any] = field(default_factory=dict)
    metrics_source: str = ""
    environment: dict[str, str] = field(default_factory=dict)
    customer_metadata: dict[str, str] = field(default_factory=dict)
    description: str = ""
    approval_note: str = ""

    @property
    def arn(self) -> str:
        return f"{LOCAL_ARN}:model-package/{self.group}/{self.version}"

    @property
    def status(self) -> str:
        """Alias of approval_status."""
        return self.approval_status

    @property
    def note(self) -> str:
        """Alias of approval_note (the approval description)."""
        return self.approval_note

    @property
    def accuracy(self) -> float | None:
        """The accuracy of the evaluation report in the metrics (where the gate reads it), None without one."""
        return report_accuracy(self.metrics)

    def describe(self) -> dict[str, Any]:
        """This version in the shape of boto3's `describe_model_package` response (times as datetimes)."""
        answer: dict[str, Any] = {
            "ModelPackageName": self.group,
            "ModelPackageGroupName": self.group,
            "ModelPackageVersion": self.version,
            "ModelPackageArn": self.arn,
            "ModelPackageDescription": self.description,
            "CreationTime": datetime.fromisoformat(self.created),
            "LastModifiedTime": datetime.fromisoformat(self.modified),
            "InferenceSpecification": {
                "Containers": [
                    {"Image": self.image, "ModelDataUrl": self.model_data, "Environment": dict(self.environment)}
                ],
                "SupportedContentTypes": list(self.content_types),
                "SupportedResponseMIMETypes": list(self.response_types),
                "SupportedRealtimeInferenceInstanceTypes": list(self.inference_instances),
            },
            "ModelPackageStatus": "Completed",
            "ModelApprovalStatus": self.approval_status,
            "ApprovalDescription": self.approval_note,
            "CustomerMetadataProperties": dict(self.customer_metadata),
            "CertifyForMarketplace": False,
        }
        if self.metrics:
            answer["ModelMetrics"] = {
                "ModelQuality": {"Statistics": {"ContentType": "application/json", "S3Uri": self.metrics_source}}
            }
            answer["LocalMetrics"] = self.metrics  # not in AWS's answer: the metrics themselves, inline
        return answer


class Registry:
    """Model package groups and versions in the SQLite file `path` (created on first use)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._transaction() as db:
            db.executescript(_SCHEMA)
            columns = {row["name"] for row in db.execute("PRAGMA table_info(model_packages)")}
            for column, empty in (("environment", "{}"), ("response_types", "[]")):  # added after the first release
                if column not in columns:
                    db.execute(f"ALTER TABLE model_packages ADD COLUMN {column} TEXT NOT NULL DEFAULT '{empty}'")

    @contextmanager
    def _transaction(self, write: bool = False) -> Iterator[sqlite3.Connection]:
        try:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        except sqlite3.OperationalError as error:
            raise self._storage_error(error) from error
        db.row_factory = sqlite3.Row
        try:
            if write:
                db.execute("BEGIN IMMEDIATE")  # take the write lock before reading the next version number
            yield db
            if write:
                db.execute("COMMIT")
        except BaseException as error:
            if db.in_transaction:
                db.execute("ROLLBACK")
            if isinstance(error, sqlite3.OperationalError) and (fault := self._storage_error(error)) is not error:
                raise fault from error
            raise
        finally:
            db.close()

    def _storage_error(self, error: sqlite3.OperationalError) -> OSError | sqlite3.OperationalError:
        """SQLite's disk-full, read-only and cannot-open errors as the OSError of the registry file (its folder and
        cause go into one line); any other error as it is."""
        text = str(error).lower()
        if "disk is full" in text or "disk i/o error" in text and _full(self.path.parent):
            number = errno.ENOSPC
        elif "readonly" in text or "unable to open" in text:
            number = errno.EROFS if _read_only(self.path.parent) else errno.EACCES
        else:
            return error
        return OSError(number, os.strerror(number), str(self.path))

    def create_group(self, name: str, description: str = "") -> None:
        """Create the model package group `name`; does nothing when it exists."""
        with self._transaction(write=True) as db:
            self._ensure_group(db, name, description)

    @staticmethod
    def _ensure_group(db: sqlite3.Connection, name: str, description: str = "") -> None:
        if not name or "/" in name:
            raise ValueError(f"invalid model package group name {name!r}")
        db.execute(
            "INSERT OR IGNORE INTO model_package_groups (name, description, created) VALUES (?, ?, ?)",
            (name, description, _now()),
        )

    @staticmethod
    def _check_metadata(metadata: Mapping[str, str]) -> None:
        """CreateModelPackage's and UpdateModelPackage's limits on CustomerMetadataProperties (botocore's model):
        the service refuses the request otherwise, so a local run must too."""
        if len(metadata) > METADATA_ENTRIES:
            raise ValueError(f"customer metadata: {len(metadata)} entries, at most {METADATA_ENTRIES}")
        for key, value in metadata.items():
            for what, text, most in (("key", key, METADATA_KEY_LENGTH), ("value", value, METADATA_VALUE_LENGTH)):
                if not tag_text(text, most, least=1):
                    raise ValueError(f"customer metadata {key!r}: the {what} {text[:60]!r} must have 1 to {most} "
                                     f"characters of {TAG_CHARACTERS}")

    def groups(self) -> list[dict[str, str]]:
        """All groups: [{"name", "description", "created"}], by name."""
        with self._transaction() as db:
            rows = db.execute("SELECT name, description, created FROM model_package_groups ORDER BY name").fetchall()
        return [dict(row) for row in rows]

    def register(
        self,
        group: str,
        model_data: str | Path,
        *,
        approval_status: str,
        metrics: Mapping[str, Any] | str | Path | None = None,
        customer_metadata: Mapping[str, str] | None = None,
        image: str = "",
        content_types: Iterable[str] = (),
        response_types: Iterable[str] = (),
        inference_instances: Iterable[str] = (),
        description: str = "",
        environment: Mapping[str, str] | None = None,
    ) -> ModelVersion:
        """Add the next version to `group` (created if missing).

        `model_data` is a local path (stored absolute) or a URI; `metrics` is evaluation.json's content or its path;
        `environment` the serving container's environment variables.
        """
        _check_status(approval_status)
        model_data = str(model_data) if "://" in str(model_data) else str(Path(model_data).resolve())
        metrics_source = ""
        if isinstance(metrics, (str, Path)):
            metrics_source = str(Path(metrics).resolve())
            metrics = json.loads(Path(metrics).read_text())
        metadata = {str(k): str(v) for k, v in (customer_metadata or {}).items()}
        self._check_metadata(metadata)
        now = _now()
        with self._transaction(write=True) as db:
            self._ensure_group(db, group)
            (version,) = db.execute(
                "SELECT COALESCE(MAX(version), 0) + 1 FROM model_packages WHERE group_name = ?", (group,)
            ).fetchone()
            db.execute(
                "INSERT INTO model_packages (group_name, version, model_data, image, content_types, response_types,"
                " inference_instances, metrics, metrics_source, customer_metadata, environment, description, status,"
                " note, created, modified) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '', ?, ?)",
                (
                    group,
                    version,
                    model_data,
                    image,
                    json.dumps(list(content_types)),
                    json.dumps(list(response_types)),
                    json.dumps(list(inference_instances)),
                    json.dumps(dict(metrics or {})),
                    metrics_source,
                    json.dumps(metadata),
                    json.dumps({str(k): str(v) for k, v in (environment or {}).items()}),
                    description,
                    approval_status,
                    now,
                    now,
                ),
            )
            return self._get(db, group, version)

    def get(self, group: str, version: int) -> ModelVersion:
        """Version `version` of `group`; ModelNotFoundError when there is none."""
        with self._transaction() as db:
            return self._get(db, group, version)

    def list(self, group: str, status: str | None = None, sort: str = "desc") -> list[ModelVersion]:
        """The versions of `group`, optionally only those with approval status `status`, by version number."""
        if status is not None:
            _check_status(status)
        if sort not in ("asc", "desc"):
            raise ValueError(f"invalid sort {sort!r}: expected 'asc' or 'desc'")
        query = "SELECT * FROM model_packages WHERE group_name = ?"
        args: tuple[Any, ...] = (group,)
        if status is not None:
            query += " AND status = ?"
            args += (status,)
        with self._transaction() as db:
            rows = db.execute(f"{query} ORDER BY version {sort.upper()}", args).fetchall()
        return [self._version(row) for row in rows]

    def set_status(self, group: str, version: int, status: str, note: str = "") -> ModelVersion:
        """Set the approval status of a version (and its approval description `note`)."""
        _check_status(status)
        with self._transaction(write=True) as db:
            cursor = db.execute(
                "UPDATE model_packages SET status = ?, note = ?, modified = ? WHERE group_name = ? AND version = ?",
                (status, note, _now(), group, int(version)),
            )
            if cursor.rowcount == 0:
                raise ModelNotFoundError(f"model package {group}/{version} does not exist")
            return self._get(db, group, version)

    def update_metadata(self, group: str, version: int, values: Mapping[str, str]) -> ModelVersion:
        """Merge `values` into the version's customer metadata (UpdateModelPackage's CustomerMetadataProperties)."""
        with self._transaction(write=True) as db:
            current = self._get(db, group, version)
            merged = {**current.customer_metadata, **{str(k): str(v) for k, v in values.items()}}
            self._check_metadata(merged)
            db.execute(
                "UPDATE model_packages SET customer_metadata = ?, modified = ? WHERE group_name = ? AND version = ?",
                (json.dumps(merged), _now(), group, int(version)),
            )
            return self._get(db, group, version)

    def approve(self, group: str, version: int, note: str = "") -> ModelVersion:
        """Shorthand for set_status(group, version, "Approved", note)."""
        return self.set_status(group, version, APPROVED, note)

    def reject(self, group: str, version: int, note: str = "") -> ModelVersion:
        """Shorthand for set_status(group, version, "Rejected", note)."""
        return self.set_status(group, version, REJECTED, note)

    def latest_approved(self, group: str) -> ModelVersion | None:
        """The highest approved version of `group`, or None."""
        approved = self.list(group, status=APPROVED, sort="desc")
        return approved[0] if approved else None

    def _get(self, db: sqlite3.Connection, group: str, version: int) -> ModelVersion:
        row = db.execute(
            "SELECT * FROM model_packages WHERE group_name = ? AND version = ?", (group, int(version))
        ).fetchone()
        if row is None:
            raise ModelNotFoundError(f"model package {group}/{version} does not exist")
        return self._version(row)

    @staticmethod
    def _version(row: sqlite3.Row) -> ModelVersion:
        return ModelVersion(
            group=row["group_name"],
            version=row["version"],
            model_data=row["model_data"],
            approval_status=row["status"],
            created=row["created"],
            modified=row["modified"],
            image=row["image"],
            content_types=tuple(json.loads(row["content_types"])),
            response_types=tuple(json.loads(row["response_types"])),
            inference_instances=tuple(json.loads(row["inference_instances"])),
            metrics=json.loads(row["metrics"]),
            metrics_source=row["metrics_source"],
            customer_metadata=json.loads(row["customer_metadata"]),
            environment=json.loads(row["environment"]),
            description=row["description"],
            approval_note=row["note"],
        )
