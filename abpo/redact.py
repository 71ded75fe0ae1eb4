"""What abpo never prints: the one redaction function every message, log line and config dump goes through
(:func:`redact`), so a password or key given in a URI (a tracking URI ``http://user:secret@host``, a
``postgresql://user:secret@db/mlflow`` store, an object-store URI's query ``?secret_key=...``) or in the environment
(AWS_SECRET_ACCESS_KEY, MLFLOW_TRACKING_PASSWORD, ...) never reaches a terminal, a task log or an error.

Three rules, applied to any text (a URI alone, or a whole message holding URIs anywhere in it):

- a URI's userinfo password: ``scheme://user:secret@`` -> ``scheme://user:***@``;
- a query parameter whose name says it is a secret (password, secret, token, signature, credential, key):
  ``?secret_key=abc`` -> ``?secret_key=***``;
- the literal value of every secret known to this process: the environment's secret variables (a name with
  PASSWORD, SECRET, TOKEN, CREDENTIAL or a trailing KEY), read when :func:`redact` runs, and every secret
  :func:`register` was given (the tracking URI's password, once abpo.registry.configure has seen it), so a library
  message that quotes the password without its URI is caught too.

The bottom layer of abpo (it imports nothing of abpo): the logs, the registry, the storage and the CLI all use it.
"""

from __future__ import annotations

import os
import re
from urllib.parse import unquote

MASK = "***"
# scheme://user:password@ (the password: anything up to the '@' that ends the userinfo, no '/' or blank in between)
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@'\"]*):([^\s/@'\"]+)@")
# a query parameter whose name marks a secret (?password=, &secret_key=, &X-Amz-Signature=, &access_token=, &sig=)
_SECRET_PARAM = re.compile(
    r"([?&;](?:[A-Za-z0-9_.\-]*(?:password|passwd|pwd|secret|token|signature|credential|sig|key))=)([^&\s'\"#]+)",
    re.IGNORECASE,
)
# environment variables whose value is a secret: AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, MLFLOW_TRACKING_PASSWORD,
# MLFLOW_TRACKING_TOKEN, DATABRICKS_TOKEN, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_KEY, ...
_SECRET_ENV = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|_KEY$|^KEY$", re.IGNORECASE)
# the URIs a deployment exports whose userinfo may hold a password
_URI_ENV = ("ABPO_TRACKING_URI", "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "ABPO_MLFLOW_UI", "AIRFLOW_CONN_")
MIN_SECRET_LENGTH = 4  # a shorter "secret" would blank out ordinary text where it happens to occur

_registered: set[str] = set()


def uri_password(uri: str) -> str:
    """The password in ``uri``'s userinfo (percent-decoded), or ''."""
    m = _USERINFO.search(str(uri))
    return unquote(m.group(2)) if m else ""


def has_userinfo(uri: str) -> bool:
    """Whether ``uri`` carries credentials: a ``user:password@`` userinfo or a secret query parameter."""
    return bool(_USERINFO.search(str(uri)) or _SECRET_PARAM.search(str(uri)))


def register(secret: str) -> None:
    """Add ``secret`` to the values :func:`redact` blanks out wherever they appear, in this process; inside an Airflow
    task also to Airflow's own secrets masker, which masks it in everything the task logs (tracebacks included)."""
    secret = str(secret or "")
    if len(secret) < MIN_SECRET_LENGTH or secret in _registered:
        return
    _registered.add(secret)
    import sys

    if "airflow.sdk" in sys.modules:  # a task: Airflow masks it in the task log too (its structlog output)
        try:
            from airflow.sdk.log import mask_secret

            mask_secret(secret)
        except Exception:  # noqa: BLE001, S110 - an Airflow without the masker: abpo's own redaction still applies
            pass


def register_uri_secret(uri: str) -> None:
    """:func:`register` the password in ``uri``'s userinfo (if any): the tracking URI abpo.registry.configure uses."""
    register(uri_password(uri))


def known_secrets() -> list[str]:
    """Every secret value :func:`redact` blanks out now: the registered ones, the environment's secret variables and
    the passwords in the URIs the environment exports; longest first (a secret containing another is blanked
    whole)."""
    found = set(_registered)
    for name, value in os.environ.items():
        if not value:
            continue
        if _SECRET_ENV.search(name) and len(value) >= MIN_SECRET_LENGTH:
            found.add(value)
        if name.startswith(_URI_ENV):
            pw = uri_password(value)
            if len(pw) >= MIN_SECRET_LENGTH:
                found.add(pw)
    return sorted(found, key=len, reverse=True)


def redact(text: object) -> str:
    """``text`` (anything, as ``str``) with every password, secret query parameter and known secret value replaced
    by ``***`` (the rules in the module docstring). Idempotent; text without a secret is returned unchanged."""
    out = _USERINFO.sub(lambda m: f"{m.group(1)}:{MASK}@", str(text))
    out = _SECRET_PARAM.sub(lambda m: m.group(1) + MASK, out)
    for secret in known_secrets():
        if secret in out:
            out = out.replace(secret, MASK)
        quoted = secret.replace("%", "%25").replace("@", "%40").replace(":", "%3A").replace("/", "%2F")
        if quoted != secret and quoted in out:
            out = out.replace(quoted, MASK)
    return out
