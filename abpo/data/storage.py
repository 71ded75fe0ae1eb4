"""Object storage for the landing zone, the dataset files and MLflow's artifacts: ``s3://``, ``gs://``, ``hdfs://``
URIs through pyarrow's own filesystems, any other ``scheme://`` through fsspec (``abfs://``, ``memory://``, ...,
when the fsspec implementation is installed). A local path is never a URI and never comes here: every caller keeps
its local code path as it was, and branches on :func:`is_uri`.

Credentials never come from the config file: pyarrow's S3 filesystem and boto3 (MLflow's artifact store) read the
standard AWS chain (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE, the instance or pod
role), and the endpoint of an S3-compatible store (MinIO, Ceph, a test server) from $AWS_ENDPOINT_URL (or
$AWS_ENDPOINT_URL_S3; MLflow also reads $MLFLOW_S3_ENDPOINT_URL). An Airflow Connection can supply them instead:
$ABPO_STORAGE_CONNECTION names it (:func:`apply_connection`, docs/scaling.md).

Errors are :class:`StorageError`, one line naming the URI and the rule broken: a bucket that does not exist, access
denied (wrong or missing credentials, a policy that refuses), a scheme nothing can read.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from abpo.redact import redact

URI_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
# the marker a producer writes last into an object-store landing partition (uploads are not atomic as a directory
# rename is): $ABPO_LANDING_MARKER, the variable the DAG's landing sensor reads; empty: files suffice
MARKER_ENV = "ABPO_LANDING_MARKER"
DEFAULT_MARKER = "_SUCCESS"
CONNECTION_ENV = "ABPO_STORAGE_CONNECTION"

# what the S3 API's error codes (as pyarrow and boto3 spell them) mean, in one clause
_DENIED = (
    "ACCESS_DENIED",
    "AccessDenied",
    "SIGNATURE_DOES_NOT_MATCH",
    "SignatureDoesNotMatch",
    "INVALID_ACCESS_KEY_ID",
    "InvalidAccessKeyId",
    "EXPIRED_TOKEN",
    "ExpiredToken",
    "PERMISSION_DENIED",
    "Forbidden",
)
_NO_BUCKET = ("NO_SUCH_BUCKET", "NoSuchBucket", "bucket does not exist")


class StorageError(OSError):
    """An object-store location cannot be read or written; the message names the URI (its credentials blanked out,
    abpo.redact) and the problem."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class StorageUnavailable(StorageError):
    """The object store did not answer (an endpoint that is down or does not resolve, a connection refused or cut, a
    timeout): transient, retried (abpo.monthly.common.TRANSIENT), unlike a missing bucket or denied access."""


# what a network failure looks like in pyarrow's and boto3's messages (curl's codes, the AWS SDK's error names)
_NETWORK = (
    "NETWORK_CONNECTION",
    "curlCode",
    "Couldn't connect",
    "Could not connect",
    "Couldn't resolve",
    "Could not resolve",
    "Connection refused",
    "Connection reset",
    "timed out",
    "Timeout",
    "EndpointConnectionError",
    "Unable to connect",
    "SERVICE_UNAVAILABLE",
    "SLOW_DOWN",
    "INTERNAL_FAILURE",
)


def unavailable(error: BaseException) -> bool:
    """Whether ``error`` (raised by pyarrow's or fsspec's filesystem) is the store not answering, as opposed to a
    refusal (a missing bucket, denied access, a bad object)."""
    text = " ".join(str(error).split())
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    return not any(code in text for code in (*_DENIED, *_NO_BUCKET)) and any(n in text for n in _NETWORK)


def _error(uri: str, error: BaseException, doing: str) -> StorageError:
    """The StorageError for ``error`` raised while ``doing`` at ``uri``: StorageUnavailable when the store did not
    answer (:func:`unavailable`, retried), else StorageError (a refusal)."""
    cls = StorageUnavailable if unavailable(error) else StorageError
    return cls(describe(uri, error, doing))


def is_uri(p: object) -> bool:
    """True for ``scheme://...`` other than ``file://`` (an object store or another fsspec filesystem)."""
    m = URI_RE.match(str(p))
    return m is not None and m.group(1).lower() != "file"


def split_query(uri: str) -> tuple[str, str]:
    """(``scheme://bucket/path``, ``query``) of a URI that may carry pyarrow options (``?endpoint_override=...``)."""
    base, _, query = str(uri).partition("?")
    return base, query


def join(uri: str, *parts: str) -> str:
    """``uri/part/part`` keeping the URI's query (its filesystem options) at the end."""
    base, query = split_query(uri)
    out = "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
    return f"{out}?{query}" if query else out


def basename(uri: str) -> str:
    return split_query(uri)[0].rstrip("/").rsplit("/", 1)[-1]


def bucket(uri: str) -> str:
    """The bucket (the first component after the scheme) of ``uri``."""
    return urlsplit(split_query(uri)[0]).netloc


def landing_marker() -> str:
    """The marker an object-store landing partition must hold before it is read ($ABPO_LANDING_MARKER, default
    ``_SUCCESS``; set empty to read a partition as soon as it holds files)."""
    return os.environ.get(MARKER_ENV, DEFAULT_MARKER)


def describe(uri: str, error: BaseException, doing: str) -> str:
    """One line for ``error`` raised while ``doing`` at ``uri``: a missing bucket and a refusal are named as such."""
    text = " ".join(str(error).split())
    if any(code in text for code in _NO_BUCKET):
        return (
            f"{uri}: bucket {bucket(uri)!r} does not exist ({doing}); rule: the bucket is created before abpo "
            "reads or writes it"
        )
    if isinstance(error, PermissionError) or any(code in text for code in _DENIED):
        code = next((c for c in _DENIED if c in text), type(error).__name__)
        return (
            f"{uri}: access denied ({code} while {doing}); rule: credentials come from the environment "
            f"(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, the instance role) or ${CONNECTION_ENV}, "
            "and must allow it"
        )
    if "resolving region" in text:
        return (
            f"{uri}: {doing} failed ({type(error).__name__}: {text[:300]}); rule: without a region (AWS_REGION, "
            "AWS_DEFAULT_REGION or ?region= in the URI) pyarrow asks AWS for the bucket's region; an S3-compatible "
            "store needs its endpoint (AWS_ENDPOINT_URL)"
        )
    return f"{uri}: {doing} failed ({type(error).__name__}: {text[:300]})"


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path inside it) for ``uri``: pyarrow's own for s3/gs/hdfs, else fsspec's wrapped."""
    apply_connection()
    try:
        return pafs.FileSystem.from_uri(uri)
    except OSError as e:  # pyarrow's S3 looks the bucket's region up at AWS when none is set: an endpoint that does
        # not resolve or answer raised here, outside every caller's handling (a pyarrow traceback): one line instead
        raise _error(uri, e, "resolving the bucket's region" if "resolving region" in str(e) else "opening") from None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as native:
        try:
            import fsspec
        except ImportError:  # pragma: no cover - fsspec ships with the pinned set (datasets needs it)
            raise StorageError(f"{uri}: no filesystem for this scheme ({native})") from None
        try:
            fs, path = fsspec.core.url_to_fs(split_query(uri)[0])
        except (ImportError, ValueError) as e:
            raise StorageError(
                f"{uri}: no filesystem for this scheme: pyarrow says {native}; fsspec says {e} "
                "(install the scheme's fsspec package, e.g. s3fs, gcsfs, adlfs)"
            ) from None
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), path


def listdir(uri: str) -> list[str] | None:
    """The URIs of the files directly under ``uri`` (names sorted), or None when there is no such directory (no
    object under that prefix). StorageError when the bucket is missing or access is denied (StorageUnavailable when
    the store does not answer). Sub-prefixes are not files: :func:`list_partition` names them."""
    listed = list_partition(uri)
    return None if listed is None else listed[0]


def list_partition(uri: str) -> tuple[list[str], list[str]] | None:
    """(the URIs of the objects directly under ``uri``, the URIs of its sub-prefixes), names sorted; None when
    nothing is under that prefix. A sub-prefix holds objects a flat listing would skip without a word, so callers
    refuse it as the local landing refuses a sub-directory."""
    fs, path = filesystem(uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    except OSError as e:
        raise _error(uri, e, "listing") from None
    if not infos:
        _check_bucket(uri, fs, path)
        return None
    files = sorted(join(uri, basename(i.path)) for i in infos if i.type == pafs.FileType.File)
    prefixes = sorted(join(uri, basename(i.path)) for i in infos if i.type == pafs.FileType.Directory)
    return files, prefixes


def _check_bucket(uri: str, fs: pafs.FileSystem, path: str) -> None:
    """An empty listing: StorageError when it is because the bucket itself is missing (S3 and GCS answer a listing
    of a missing bucket's prefix with nothing)."""
    root = path.split("/", 1)[0]
    if not root or fs.type_name not in ("s3", "gcs"):
        return
    try:
        info = fs.get_file_info(root)
    except OSError as e:
        raise _error(uri, e, "checking the bucket") from None
    if info.type == pafs.FileType.NotFound:
        raise StorageError(
            f"{uri}: bucket {root!r} does not exist; rule: the bucket is created before abpo reads or writes it"
        )


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    try:
        return fs.get_file_info(path).type != pafs.FileType.NotFound
    except OSError as e:
        raise _error(uri, e, "reading") from None


def open_input(uri: str):
    """A readable, seekable file of ``uri`` (what pyarrow.parquet and pyarrow.csv read)."""
    fs, path = filesystem(uri)
    try:
        return fs.open_input_file(path)
    except FileNotFoundError:
        raise StorageError(f"{uri}: no such object") from None
    except OSError as e:
        raise _error(uri, e, "reading") from None


DOWNLOAD_WORKERS = 8  # objects copied at a time (each copy waits on the network, not on a core)


def stat(uri: str) -> tuple[int, int | None]:
    """(size in bytes, last-modified time in ns or None) of the object ``uri``: what pins a version of it."""
    fs, path = filesystem(uri)
    try:
        info = fs.get_file_info(path)
    except OSError as e:
        raise _error(uri, e, "reading") from None
    if info.type == pafs.FileType.NotFound:
        raise StorageError(f"{uri}: no such object (deleted while the month was read)")
    return int(info.size or 0), info.mtime_ns


def _download_one(uri: str, dest: str) -> None:
    """Copy ``uri`` to ``dest``, pinned: the object's size and last-modified time are read before and after the copy
    and must not change, and the copy must have that size (StorageError otherwise: the object was rewritten while it
    was copied, and a mix of two versions is never ingested)."""
    fs, path = filesystem(uri)
    before = stat(uri)
    try:
        pafs.copy_files(path, dest, source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
    except OSError as e:
        raise _error(uri, e, "downloading") from None
    after = stat(uri)
    got = os.path.getsize(dest)
    if after != before or got != before[0]:
        raise StorageError(
            f"{uri}: changed while it was copied ({before[0]} bytes at {before[1]} before, {after[0]} bytes at "
            f"{after[1]} after, {got} bytes copied); rule: an object is ingested as one version: land it once and "
            "write the marker last, then rerun"
        )


def download(uris: list[str], directory: str | os.PathLike, workers: int = DOWNLOAD_WORKERS) -> list[str]:
    """Copy ``uris`` into the local ``directory`` (same names), :data:`DOWNLOAD_WORKERS` at a time, each pinned
    (:func:`_download_one`); returns the local paths, in order."""
    from concurrent.futures import ThreadPoolExecutor

    out = [os.path.join(os.fspath(directory), basename(uri)) for uri in uris]
    if len(uris) <= 1 or workers <= 1:
        for uri, dest in zip(uris, out, strict=True):
            _download_one(uri, dest)
        return out
    with ThreadPoolExecutor(max_workers=min(workers, len(uris))) as pool:
        for f in [pool.submit(_download_one, uri, dest) for uri, dest in zip(uris, out, strict=True)]:
            f.result()  # the first failure, in order, is raised
    return out


def write_parquet(table: pa.Table, uri: str, **kw) -> None:
    """Write ``table`` as the Parquet object ``uri`` (an object PUT is atomic: a reader sees all of it or none)."""
    import pyarrow.parquet as pq

    fs, path = filesystem(uri)
    try:
        pq.write_table(table, path, filesystem=fs, **kw)
    except OSError as e:
        raise _error(uri, e, "writing") from None


def touch(uri: str) -> None:
    """Write the empty object ``uri`` (a partition's completion marker)."""
    fs, path = filesystem(uri)
    try:
        with fs.open_output_stream(path):
            pass
    except OSError as e:
        raise _error(uri, e, "writing") from None


_applied: set[str] = set()


def apply_connection() -> None:
    """When $ABPO_STORAGE_CONNECTION names an Airflow Connection (type aws: login = access key id, password = secret
    key, extra ``endpoint_url`` and ``region_name``), export it as the AWS variables that pyarrow and boto3 read,
    once per process, without overriding variables already set. Airflow resolves the Connection as it does for any
    hook: its metadata database, a secrets backend, or an ``AIRFLOW_CONN_<ID>`` variable."""
    conn_id = os.environ.get(CONNECTION_ENV, "").strip()
    if not conn_id or conn_id in _applied:
        return
    try:
        from airflow.sdk import Connection

        conn = Connection.get(conn_id)
    except Exception as e:  # noqa: BLE001 - any lookup failure is one line naming the connection
        raise StorageError(
            f"${CONNECTION_ENV}={conn_id!r}: the Airflow Connection cannot be read "
            f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"
        ) from None
    extra = conn.extra_dejson or {}
    values = {
        "AWS_ACCESS_KEY_ID": conn.login,
        "AWS_SECRET_ACCESS_KEY": conn.password,
        "AWS_SESSION_TOKEN": extra.get("aws_session_token"),
        "AWS_ENDPOINT_URL": extra.get("endpoint_url"),
        "AWS_DEFAULT_REGION": extra.get("region_name"),
    }
    for var, value in values.items():
        if value and not os.environ.get(var):
            os.environ[var] = str(value)
    _applied.add(conn_id)
