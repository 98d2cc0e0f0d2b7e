"""Whose cache a local folder is: the remote that fills it, and the user who owns it.

A shard file in ``<local>/[split/]`` is trusted by its name and size (and by its digest
where ``validate_hash`` asks). Two remotes whose shards have the same names and sizes
would therefore share files: a folder filled from remote A and then read for remote B
served A's samples under B's index, silently (issue 31, item 1). So the first dataset
that caches a remote in a folder records it there, in a small marker file
(:data:`ORIGIN_NAME`), and a dataset of another remote on that folder is refused, as
MosaicML refuses a reused local directory: at once for a dataset still alive, and also
for a later process (MosaicML only sees the live ones), since the files stay.

A folder another user owns is refused as a cache too (issue 32, finding 3): that user
could have planted shards of the right names and sizes, or could read the data. A folder
astream cannot write (a read-only copy of a dataset) gets no marker: nothing of another
remote can come into it through astream either.

Decided here, before any byte of the remote comes in (:func:`claim_folder`, called once
per stream when a dataset is built). A folder without a marker but with files in it (an
older astream's, or MosaicML's) is adopted by the first remote that claims it: its
shards are still checked against that remote's index (sizes always, digests with
``validate_hash``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile

from astream._storage.local import local_path_of
from astream._storage.registry import join_url, scheme_of
from astream.errors import CacheError, ConfigError

__all__ = ["ORIGIN_NAME", "check_owner", "claim_folder", "default_cache_base", "private_index_folder", "read_origin"]

ORIGIN_NAME = ".astream-origin.json"
_MAX_MARKER = 64 << 10  # a marker is one URL; more is not one of ours


def default_cache_base() -> str:
    """Where streams without ``local`` are cached, one folder per remote (no I/O here):
    ``$ASTREAM_CACHE_DIR``, else ``$XDG_CACHE_HOME/astream``, else ``<tmp>/astream-<uid>``.

    Per user, and private (:func:`claim_folder` makes it 0700 and checks who owns it): a
    folder shared by every user of the host, as ``<tmp>/astream`` was, let another user
    read the cached data, or make the folder first and plant shards in it (issue 32,
    finding 3). ``<tmp>/astream-<uid>`` is also where the node agents' socket files go
    without ``$XDG_RUNTIME_DIR``, under the same rules.
    """
    explicit = os.environ.get("ASTREAM_CACHE_DIR")
    if explicit:
        return explicit
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return os.path.join(xdg, "astream")
    return os.path.join(tempfile.gettempdir(), f"astream-{os.getuid()}")


def private_index_folder() -> str:
    """Where the node's binary indexes of datasets read in place go (the user's data folder is
    never written): ``<default_cache_base()>/indexes``, made private (0700) as the base is.

    Raises:
        ConfigError, OSError: it cannot be made, or is not this user's alone.
    """
    base = default_cache_base()
    _private_folder(base, shared_parent=not (os.environ.get("ASTREAM_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")))
    folder = os.path.join(base, "indexes")
    _private_folder(folder, shared_parent=False)
    return folder


def _private_folder(path: str, *, shared_parent: bool) -> None:
    """Make ``path`` a folder of this user only (0700), or check that it is one.

    ``shared_parent``: ``path`` sits in a folder every user writes (the temporary folder):
    it must not be a symlink, and must be exactly 0700, as the runtime folder.
    """
    uid = os.getuid()
    if not shared_parent:
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    problem = None
    if stat.S_ISLNK(info.st_mode) and shared_parent:
        problem = "is a symlink (anyone can make one in the temporary folder)"
    elif not stat.S_ISDIR(os.stat(path).st_mode):
        problem = "is not a folder"
    elif info.st_uid != uid:
        problem = f"belongs to uid {info.st_uid}"
    elif shared_parent and info.st_mode & 0o077:
        problem = f"is open to other users (mode {info.st_mode & 0o777:o})"
    if problem is not None:
        raise ConfigError(
            f"the default cache folder {path} {problem}, not a private folder of uid {uid}: another user could "
            "read what astream caches there, or put shards there that it would serve; remove it, or set "
            "ASTREAM_CACHE_DIR (or local=) to a folder of your own"
        )


def _root(local: str, split: str | None) -> str:
    return os.path.join(local, split) if split else local


def read_origin(root: str) -> str | None:
    """The remote recorded in the folder ``root``, or None (no marker, or not one of ours)."""
    path = os.path.join(root, ORIGIN_NAME)
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_MARKER + 1)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise CacheError(f"cannot read {path} (the record of which remote fills this folder): {exc}") from exc
    try:
        remote = json.loads(raw).get("remote")
    except (ValueError, AttributeError):
        remote = None
    if not isinstance(remote, str) or len(raw) > _MAX_MARKER:
        raise CacheError(f"{path} is not astream's record of the remote that fills this folder; delete it "
                         "(and the folder's shards, if you do not know where they came from)")
    return remote


def check_owner(path: str, what: str = "local") -> None:
    """Refuse a cache folder (or one of its parents astream created) owned by another user.

    Raises:
        ConfigError: ``path`` exists and another uid owns it; the message says why it matters.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise CacheError(f"{what}={path!r}: cannot look at the folder: {exc}") from exc
    uid = os.getuid()
    if info.st_uid != uid:
        raise ConfigError(
            f"{what}={path!r} belongs to uid {info.st_uid}, not to this user (uid {uid}): another user could "
            "have put shards there that astream would serve, or could read what it caches; use a folder of "
            "your own as the cache (local=, or ASTREAM_CACHE_DIR)"
        )


def _same_place(remote_root: str, root: str) -> bool:
    return scheme_of(remote_root) in ("", "file") and os.path.realpath(local_path_of(remote_root)) == os.path.realpath(root)


def claim_folder(local: str, remote: str | None, split: str | None, *, default: bool = False) -> None:
    """Make ``<local>/[split]`` the cache of ``remote`` (see the module docstring). Blocks
    for a few ``stat`` calls and, the first time, one small write.

    Nothing for a dataset without a remote, or whose remote is the folder itself: such a
    folder is the user's data, not a cache.

    ``default``: ``local`` is the default cache folder of the remote (no ``local`` given):
    it and its base (:func:`default_cache_base`) are made private (0700) first.

    Raises:
        ConfigError: the folder is the cache of another remote ("Reused local directory",
            as MosaicML words it), or belongs to another user.
        CacheError: the marker cannot be read or written (other than a read-only folder).
    """
    if remote is None:
        return
    root = _root(local, split)
    remote_root = join_url(remote, split) if split else remote.rstrip("/")
    if _same_place(remote_root, root):
        return
    if default:
        base = os.path.dirname(local.rstrip(os.sep))
        try:
            _private_folder(base, shared_parent=not (os.environ.get("ASTREAM_CACHE_DIR")
                                                     or os.environ.get("XDG_CACHE_HOME")))
            _private_folder(local, shared_parent=False)
        except ConfigError:
            raise
        except OSError as exc:
            raise CacheError(f"cannot make the default cache folder {local}: {exc}") from exc
    check_owner(local)
    if root != local:
        check_owner(root)
    recorded = read_origin(root)
    if recorded is None:
        recorded = _record(root, remote_root)
    if recorded is not None and recorded.rstrip("/") != remote_root.rstrip("/"):
        raise ConfigError(
            f"Reused local directory: {root} is the cache of remote {recorded!r}, and this dataset's remote "
            f"is {remote_root!r}; shards of the same names would be served from the other remote. Provide a "
            "different local (or delete that folder to cache the new remote there)"
        )


def _record(root: str, remote_root: str) -> str | None:
    """Write the marker unless one exists (exclusively: of two processes claiming the folder
    for two remotes at once, one wins and the other is refused); returns the remote now
    recorded, or None for a folder astream cannot write."""
    path = os.path.join(root, ORIGIN_NAME)
    try:
        os.makedirs(root, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(json.dumps({"remote": remote_root}).encode())
        try:
            os.link(tmp, path)  # fails if it exists: never replaces another's record
        except FileExistsError:
            return read_origin(root)
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            if not os.path.exists(path):  # no hard links on this file system: a rename, not exclusive
                os.replace(tmp, path)
            return read_origin(root)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return None  # a read-only copy: astream brings nothing into it, of this remote or another
        raise CacheError(f"cannot record the remote of the cache folder {root}: {exc}") from exc
    return remote_root
