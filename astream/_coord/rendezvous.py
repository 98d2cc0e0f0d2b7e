"""Where a node's processes meet: the agent's socket address, binding it, reaching it.

Every process of a node that reads the same dataset through the same local cache for the
same run derives the same address from ``(realpath(local), run_id, uid, view)``, where the
view is the dataset's identity (its indexes, splits, columns and cache settings, see
``astream._node.provider.view_of``): two datasets of one job on one ``local`` (a train
and a val split, say) meet at two agents and never share one's books (issue 32, finding 1):

- on Linux, a name in the abstract socket namespace (``\\0astream-<hash>``): nothing on
  disk, and the kernel frees the name the instant the last process holding it dies, so a
  SIGKILLed agent leaves nothing to clean up;
- elsewhere (or with ``namespace="filesystem"``), a socket file in a 0700 runtime folder
  of the user, guarded by an ``flock`` while a stale file from a dead run is reclaimed.

Whoever binds the address first is the leader and starts the agent. Only processes of the
same user take part: the agent checks each client's peer credentials and the client
checks the agent's, so another user can neither join nor impersonate the agent. An
abstract name another user holds (anyone may bind one) sends the node's processes to
the same address as a socket file in the user's private runtime folder instead
(:meth:`Address.private`): squatting costs that user nothing of the job.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
import struct
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from astream.errors import ConfigError, CoordinationError

__all__ = [
    "RUN_ID_VARIABLES", "Address", "Squatted", "default_run_id", "derive_address", "listening_agents", "peer_credentials",
    "resolve_run_id", "run_id_from_env", "try_bind", "try_connect",
]

# Variables whose value is the same for every process of one job and differs between
# jobs, in the order they are tried (MASTER_ADDR:MASTER_PORT and TF_CONFIG's cluster after).
_RUN_ID_VARS = (
    "ASTREAM_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "JAX_COORDINATOR_ADDRESS",
    "PMIX_NAMESPACE",  # PMIx launchers: Open MPI 5's prterun, srun --mpi=pmix
    "OMPI_MCA_ess_base_jobid",  # Open MPI 4's mpirun
)


@dataclass(frozen=True)
class Address:
    """A node agent's address.

    Attributes:
        name: the string to ``bind``/``connect`` (starts with NUL for an abstract name).
        abstract: whether it lives in the abstract namespace.
        digest: the hash naming this node's run; used in log messages.
    """

    name: str
    abstract: bool
    digest: str

    @property
    def lock_path(self) -> str:
        """Lock file used while (re)claiming a filesystem socket."""
        return self.name + ".lock"

    def __str__(self) -> str:
        return f"@astream-{self.digest}" if self.abstract else self.name

    def private(self) -> Address:
        """The same node's address as a socket file in the user's 0700 runtime folder: where
        its processes meet when another user squats the abstract name (which anyone may bind)."""
        return Address(os.path.join(runtime_dir(os.getuid()), f"{self.digest}.sock"), False, self.digest)


class Squatted(CoordinationError):
    """The address is held by a process of another user (an abstract name: anyone may bind it)."""

    def __init__(self, message: str, address: Address) -> None:
        super().__init__(message)
        self.address = address


#: Every environment variable a run id is read from.
RUN_ID_VARIABLES: tuple[str, ...] = (*_RUN_ID_VARS, "SLURM_STEP_ID", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG")


def run_id_from_env(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """A run id from the launcher's environment, and the variable it came from.

    ``ASTREAM_RUN_ID``, then torchrun's ``TORCHELASTIC_RUN_ID``, SLURM's job and step ids,
    JAX's coordinator address, PMIx's namespace, Open MPI's job id,
    ``MASTER_ADDR:MASTER_PORT``, and a digest of ``TF_CONFIG``'s cluster; ``("", "")``
    when none is set.
    """
    env = os.environ if env is None else env
    for name in _RUN_ID_VARS:
        if env.get(name):
            value = f"{name}={env[name]}.{env.get('SLURM_STEP_ID', '')}" if name == "SLURM_JOB_ID" else env[name]
            return value, name
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", "MASTER_ADDR:MASTER_PORT"
    cluster = _tf_cluster(env.get("TF_CONFIG"))
    if cluster is not None:
        return "tf-" + hashlib.sha256(cluster.encode()).hexdigest()[:16], "TF_CONFIG"
    return "", ""


def _tf_cluster(raw: str | None) -> str | None:
    # Every task of a TF job shares the cluster spec (the task part differs per process).
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except ValueError:
        return None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    return json.dumps(cluster, sort_keys=True) if isinstance(cluster, dict) and cluster else None


def default_run_id() -> str:
    """:func:`run_id_from_env`'s run id alone (``""`` when the environment has none)."""
    return run_id_from_env()[0]


def resolve_run_id(run_id: str | None, ranks_per_node: int, env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """The run id a dataset's processes meet under, and where it came from.

    An explicit ``run_id`` wins, then the launcher's environment (:func:`run_id_from_env`).
    A node with one rank may have neither: it gets a run id of its own. Several ranks on
    one node with neither could not find each other's agent, so that is refused.

    Raises:
        CoordinationError: ``ranks_per_node > 1`` and no run id is known; the message names
            the variables that give one.
    """
    if run_id is not None:
        return run_id, "run_id="
    found, source = run_id_from_env(env)
    if found:
        return found, source
    if ranks_per_node > 1:
        raise CoordinationError(
            f"{ranks_per_node} ranks share this node, but nothing in the environment names the job they belong "
            "to, so they cannot find one another's node agent (each would start its own, and the first "
            "barrier would time out). Set ASTREAM_RUN_ID to the same value for every rank of the job (or pass "
            "run_id=), or launch with a launcher that sets a job id: torchrun (TORCHELASTIC_RUN_ID), SLURM "
            "(SLURM_JOB_ID), MASTER_ADDR and MASTER_PORT, PMIX_NAMESPACE / OMPI_MCA_ess_base_jobid (Open MPI), "
            "TF_CONFIG"
        )
    # One rank per node: nobody to meet, but two such jobs on one machine must not meet either.
    return f"solo-{os.getpid()}-{uuid.uuid4().hex[:8]}", "none (one rank per node)"


def derive_address(local: str, run_id: str, *, abstract: bool, uid: int | None = None, view: str = "") -> Address:
    """The agent address of the node reading dataset ``view`` through ``local`` in run ``run_id``.

    Raises:
        ConfigError: ``local`` is empty.
    """
    if not local:
        raise ConfigError("coordination needs a local cache folder")
    uid = os.getuid() if uid is None else uid
    parts = [os.path.realpath(local), run_id, str(uid), *([view] if view else [])]
    seed = "\0".join(parts).encode()
    digest = hashlib.sha256(seed).hexdigest()[:24]
    if abstract:
        return Address(f"\0astream-{digest}", True, digest)
    return Address(os.path.join(runtime_dir(uid), f"{digest}.sock"), False, digest)


def _runtime_path(uid: int) -> str:
    base = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(base, "astream") if base and os.path.isdir(base) else os.path.join(
        tempfile.gettempdir(), f"astream-{uid}"
    )


def runtime_dir(uid: int) -> str:
    """A private (0700) folder for socket files: ``$XDG_RUNTIME_DIR/astream`` or ``/tmp/astream-<uid>``.

    Raises:
        CoordinationError: the folder exists but belongs to someone else or is open to others.
    """
    path = _runtime_path(uid)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)
    if info.st_uid != uid or info.st_mode & 0o077:
        raise CoordinationError(f"{path} must be a folder owned by uid {uid} with mode 0700; remove or fix it")
    if len(path) > 80:
        raise CoordinationError(f"runtime folder {path} is too long for a Unix socket path; set XDG_RUNTIME_DIR")
    return path


_ACCEPTING = 0x10000  # __SO_ACCEPTCON in /proc/net/unix's flags: a listening socket


def listening_agents(uid: int | None = None) -> list[str] | None:
    """The node agents listening on this machine (reads ``/proc/net/unix``, creates nothing):
    every abstract ``@astream-<digest>`` name, and the socket files in ``uid``'s runtime
    folder. None where the OS does not list its sockets.

    Which cache folder an agent serves cannot be told from its name: the digest hashes
    the folder with the job's run id and the dataset's identity (:func:`derive_address`).
    An abstract name is listed whoever holds it (the kernel does not say).
    """
    try:
        with open("/proc/net/unix") as fh:
            lines = fh.read().splitlines()[1:]
    except OSError:
        return None
    folder = _runtime_path(os.getuid() if uid is None else uid) + os.sep
    found = set()
    for line in lines:
        fields = line.split()
        if len(fields) < 8 or not int(fields[3], 16) & _ACCEPTING:
            continue
        path = fields[7]
        if path.startswith("@astream-") or (path.startswith(folder) and path.endswith(".sock")):
            found.add(path)
    return sorted(found)


def peer_credentials(sock: socket.socket) -> tuple[int, int] | None:
    """``(pid, uid)`` of the process at the other end of a Unix socket, where the OS says."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, option, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return pid, uid


def try_bind(address: Address) -> socket.socket | None:
    """Bind and listen on ``address``; None when a live agent (or a rival leader) holds it.

    A filesystem socket left by a dead run (nobody accepts on it) is removed and taken
    over, under an ``flock`` so two reclaimers cannot both win.
    """
    if address.abstract:
        return _bind(address.name)
    with _flock(address.lock_path):
        if _alive(address.name):
            return None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(address.name)  # stale: its agent is gone
        return _bind(address.name)


def try_connect(address: Address) -> socket.socket | None:
    """A non-blocking socket connected to the agent, or None if no agent listens there.

    Raises:
        Squatted: the address is held by a process of another user.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        sock.connect(address.name)
    except (ConnectionRefusedError, FileNotFoundError, BlockingIOError, InterruptedError):
        sock.close()  # no listener, or its backlog is full: the caller retries
        return None
    except PermissionError as exc:
        sock.close()
        raise CoordinationError(f"no permission to reach the agent socket {address}: {exc}") from exc
    except BaseException:
        sock.close()
        raise
    creds = peer_credentials(sock)
    if creds is not None and creds[1] != os.getuid():
        sock.close()
        raise Squatted(
            f"the agent socket {address} is held by pid {creds[0]} of uid {creds[1]}, not by this user; "
            "another user is squatting it: pass another run_id", address
        )
    return sock


def _bind(name: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(name)
        if not name.startswith("\0"):
            os.chmod(name, 0o600)  # its folder is 0700 already; belt and braces
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            return None
        raise CoordinationError(f"cannot bind the agent socket {name!r}: {exc}") from exc
    return sock


def _alive(name: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)  # a full backlog blocks connect: that agent is alive
    try:
        probe.connect(name)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except TimeoutError:
        return True
    finally:
        probe.close()
    return True


@contextlib.contextmanager
def _flock(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
