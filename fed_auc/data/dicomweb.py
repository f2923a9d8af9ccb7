"""A hospital's PACS over DICOMweb: find studies (QIDO-RS), fetch instances (WADO-RS), store
results (STOW-RS), through the DICOMweb client of the highdicom authors.

A site file names the server in ``[data.pacs]``::

    [data.pacs]
    url = "https://pacs.example.org/dicom-web"
    query = { ModalitiesInStudy = "DX", StudyDate = "20260101-20260131" }   # QIDO filters
    key = "SOPInstanceUID"          # the labels CSV's column that names images (or
                                    # StudyInstanceUID: one label for every image of a study)
    username = "fed-auc"            # optional HTTP basic authentication ...
    password_env = "PACS_PASSWORD"  # ... its password from this environment variable, never
                                    # from the file
    token_env = "PACS_TOKEN"        # or a bearer token (OAuth 2.0: cloud DICOM services) from
                                    # this environment variable
    ca = "pacs-ca.pem"              # optional: the CA of an HTTPS server (relative to the file)
    timeout_s = 30                  # per request
    attempts = 3                    # tries of a request that fails (connection, 429, 503, 504),
                                    # 2 s, 4 s, ... apart

Every failure is one line naming the server: nothing answers, the login is refused, a study
is missing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KEYS = (
    "url", "query", "key", "username", "password_env", "token_env", "ca", "timeout_s", "attempts",
)  # fmt: skip
UID_KEYS = ("SOPInstanceUID", "StudyInstanceUID")
# What QIDO-RS is asked to return for each instance (DICOM keyword → tag).
FIELDS = {
    "StudyInstanceUID": "0020000D",
    "SeriesInstanceUID": "0020000E",
    "SOPInstanceUID": "00080018",
    "PatientID": "00100020",
    "StudyDate": "00080020",
}


class PacsError(ValueError):
    """The PACS could not be reached, refused the login, or lacks what was asked for."""


@dataclass(frozen=True)
class PacsSource:
    """Where a site's images live and how to ask for them (``[data.pacs]``)."""

    url: str
    query: Mapping[str, str] = field(default_factory=dict)
    key: str = "SOPInstanceUID"
    username: str | None = None
    password_env: str | None = None
    token_env: str | None = None
    ca: Path | None = None
    timeout_s: float = 30.0
    attempts: int = 3

    @classmethod
    def from_table(cls, table: Any, where: str, folder: Path | None = None) -> PacsSource:
        """Validate ``[data.pacs]``; errors name ``where`` and the key."""
        if not isinstance(table, Mapping):
            raise ValueError(f"{where}: [data.pacs] must be a table")
        unknown = sorted(set(table) - set(KEYS))
        if unknown:
            raise ValueError(f"{where}: unknown [data.pacs] key(s) {unknown}; valid: {list(KEYS)}")
        url = table.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(
                f"{where}: [data.pacs] url = {url!r}: the DICOMweb root, http(s)://host/path"
            )
        query = table.get("query", {})
        if not isinstance(query, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str | int) for k, v in query.items()
        ):
            raise ValueError(
                f"{where}: [data.pacs] query = {query!r}: a table of QIDO-RS filters "
                '(keyword = "value"), e.g. { ModalitiesInStudy = "DX" }'
            )
        key = table.get("key", "SOPInstanceUID")
        if not isinstance(key, str) or not key:
            raise ValueError(f"{where}: [data.pacs] key = {key!r}: a DICOM keyword")
        username, password_env = table.get("username"), table.get("password_env")
        if (username is None) != (password_env is None):
            raise ValueError(
                f"{where}: [data.pacs] username and password_env go together (the password "
                "is read from the environment variable password_env names)"
            )
        token_env = table.get("token_env")
        if token_env is not None and (not isinstance(token_env, str) or username is not None):
            raise ValueError(
                f"{where}: [data.pacs] token_env = {token_env!r}: the name of an environment "
                "variable holding a bearer token, instead of username and password_env"
            )
        timeout = table.get("timeout_s", 30.0)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ValueError(f"{where}: [data.pacs] timeout_s = {timeout!r}: seconds > 0")
        attempts = table.get("attempts", 3)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ValueError(f"{where}: [data.pacs] attempts = {attempts!r}: an integer ≥ 1")
        ca = table.get("ca")
        return cls(
            url=url.rstrip("/"),
            query={k: str(v) for k, v in query.items()},
            key=key,
            username=username,
            password_env=password_env,
            token_env=token_env,
            ca=None if ca is None else (folder or Path()) / str(ca),
            timeout_s=float(timeout),
            attempts=attempts,
        )

    def as_table(self) -> dict[str, Any]:
        """The table again (absolute CA path): what a site's [data] carries."""
        table: dict[str, Any] = {"url": self.url, "query": dict(self.query), "key": self.key}
        if self.username is not None:
            table |= {"username": self.username, "password_env": self.password_env}
        if self.token_env is not None:
            table["token_env"] = self.token_env
        if self.ca is not None:
            table["ca"] = str(self.ca)
        return table | {"timeout_s": self.timeout_s, "attempts": self.attempts}


class Pacs:
    """One DICOMweb server: QIDO-RS, WADO-RS and STOW-RS with one-line errors."""

    def __init__(self, source: PacsSource) -> None:
        from dicomweb_client.api import DICOMwebClient
        from dicomweb_client.session_utils import create_session, create_session_from_user_pass

        self.source = source
        if source.username is not None:
            password = os.environ.get(str(source.password_env))
            if password is None:
                raise PacsError(
                    f"PACS {source.url}: the password of user {source.username!r} is read from "
                    f"the environment variable {source.password_env}, which is not set"
                )
            session = create_session_from_user_pass(source.username, password)
        else:
            session = create_session()
        if source.token_env is not None:
            token = os.environ.get(source.token_env)
            if not token:
                raise PacsError(
                    f"PACS {source.url}: the bearer token is read from the environment variable "
                    f"{source.token_env}, which is not set"
                )
            session.headers["Authorization"] = f"Bearer {token}"
        if source.ca is not None:
            session.verify = str(source.ca)
        self.client = DICOMwebClient(url=source.url, session=session, timeout=source.timeout_s)
        self.client.set_http_retry_params(retry=source.attempts > 1, max_attempts=source.attempts)

    def find_instances(self) -> list[dict[str, str]]:
        """Every instance of the studies the query finds: its UIDs, PatientID, StudyDate."""
        fields = list(FIELDS)
        studies = self._ask(
            "find studies (QIDO-RS)",
            lambda: self.client.search_for_studies(
                search_filters=dict(self.source.query), fields=fields, get_remaining=True
            ),
        )
        found: list[dict[str, str]] = []
        for study in studies:
            uid = _value(study, "StudyInstanceUID")
            instances = self._ask(
                f"list the instances of study {uid} (QIDO-RS)",
                lambda uid=uid: self.client.search_for_instances(
                    study_instance_uid=uid, fields=fields, get_remaining=True
                ),
            )
            for instance in instances:
                row = {name: _value(instance, name) for name in FIELDS}
                row["StudyInstanceUID"] = row["StudyInstanceUID"] or uid
                row["PatientID"] = row["PatientID"] or _value(study, "PatientID")
                found.append(row)
        return found

    def fetch(self, study: str, series: str, instance: str) -> bytes:
        """One instance as a DICOM file (WADO-RS, the stored transfer syntax)."""
        from pydicom.filebase import DicomBytesIO

        dataset = self._ask(
            f"fetch instance {instance} of study {study} (WADO-RS)",
            lambda: self.client.retrieve_instance(study, series, instance),
        )
        buffer = DicomBytesIO()
        dataset.save_as(buffer, enforce_file_format=True)
        return buffer.getvalue()

    def store(self, datasets: Iterable[Any]) -> None:
        """Store these datasets on the server (STOW-RS)."""
        datasets = list(datasets)
        self._ask(
            f"store {len(datasets)} instance(s) (STOW-RS)",
            lambda: self.client.store_instances(datasets=datasets),
        )

    def _ask(self, what: str, call):
        """``call()``, its failure said in one line naming the server and what was asked."""
        import requests

        url = self.source.url
        try:
            return call()
        except requests.exceptions.SSLError as exc:
            ca = f" (ca {self.source.ca})" if self.source.ca else ""
            raise PacsError(f"PACS {url}: TLS verification failed{ca}: {exc}") from None
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
            raise PacsError(
                f"cannot reach the PACS at {url} to {what}: nothing answers there "
                f"({type(exc).__name__}); is the server running, the url right?"
            ) from None
        except requests.exceptions.HTTPError as exc:
            status = exc.response.status_code if exc.response is not None else None
            if status in (401, 403):
                who = self.source.username
                login = (
                    f"user {who!r}" if who
                    else f"the bearer token of {self.source.token_env}" if self.source.token_env
                    else "no login (username/password_env or token_env unset)"
                )  # fmt: skip
                raise PacsError(
                    f"the PACS at {url} refused the login ({status}) to {what}: {login}"
                ) from None
            if status == 404:
                raise PacsError(
                    f"the PACS at {url} does not have it (404): could not {what}"
                ) from None
            raise PacsError(f"the PACS at {url} answered {status} to: {what}") from None


def _value(item: Mapping[str, Any], keyword: str) -> str:
    """A DICOM JSON attribute's first value as text ('' when absent)."""
    element = item.get(FIELDS[keyword], {})
    values = element.get("Value") or [""]
    return str(values[0])
