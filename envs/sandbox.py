"""Run model-written Python in a subprocess that cannot hurt the machine it runs on.

Layers (each one alone is not enough; together they fail closed and say why):
- a fresh temp directory per run: the child's cwd, HOME and TMPDIR; removed afterwards;
- its own session / process group, killed as a whole (SIGKILL) on the wall-clock timeout and after
  every run, so stragglers never outlive the call;
- rlimits set in the child before any model code runs: RLIMIT_CPU (hard = soft + 1), RLIMIT_AS
  (memory), RLIMIT_FSIZE (file and output size), RLIMIT_NPROC (bites only for non-root), RLIMIT_CORE 0;
- no network: a private network namespace (`unshare(CLONE_NEWNET)` via libc, permitted for root
  here; only a down loopback inside) where the kernel allows it, and always an audit hook that
  refuses to create any socket;
- an audit hook (`sys.addaudithook`, cannot be removed once installed) that refuses: opening a file
  for writing, opening a directory (whose fd would allow `dir_fd=` writes), or removing / renaming /
  creating / chmod-ing paths, outside the temp dir (paths resolved through symlinks); process
  creation (fork, exec, spawn, system, Popen) and signals to other processes; raising rlimits; and
  importing ctypes / _posixsubprocess (the ways around the hook). A refusal ends the child at once
  with an exit code that names the reason, so catching the exception does not hide it;
- an environment scrubbed of everything but PATH, LANG/LC_ALL, PYTHONHASHSEED, HOME, TMPDIR;
  `python -S` (stdlib only, no site-packages).

`killed_reason` is one of: timeout, memory, cpu, network, filesystem, process (fork/exec/kill
refused — an addition to the original list, so a fork bomb is reported as such), error (the
program failed on its own: exception or non-zero exit), or None (exit 0).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

KilledReason = Literal["timeout", "memory", "cpu", "network", "filesystem", "process", "error"]

# Exit codes the guard uses for a refused operation (chosen clear of shells' 124-127 and signals).
_EXIT_CODES: dict[int, KilledReason] = {
    111: "network",
    112: "filesystem",
    113: "process",
    114: "memory",
}

_SAFE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONIOENCODING": "utf-8",
}


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0
    """Wall-clock limit; the whole process group is SIGKILLed after it (> 0)."""
    cpu_s: int = 5
    """RLIMIT_CPU soft limit in seconds; the hard limit is one second more (>= 1)."""
    memory_mb: int = 512
    """RLIMIT_AS: address-space limit of the child (>= 64; python itself needs ~30 MB)."""
    max_output_bytes: int = 64_000
    """How much of stdout / stderr is returned (the rest is dropped)."""
    max_file_bytes: int = 16_000_000
    """RLIMIT_FSIZE: largest file (stdout/stderr included) the child may write."""
    max_processes: int = 64
    """RLIMIT_NPROC (enforced by the kernel only for non-root users; the audit hook covers root)."""


@dataclass(frozen=True)
class SandboxResult:
    ok: bool  # exited 0 and nothing was refused
    stdout: str
    stderr: str
    returncode: int | None  # negative: killed by that signal; None: never started
    killed_reason: KilledReason | None
    seconds: float
    network_isolated: bool = False  # True when the child ran in its own network namespace


# The child's entry point, passed with `python -c`. It reads its settings from argv[1] (JSON), writes
# whether the network namespace worked to a status file outside the work dir, then locks itself in.
_GUARD = r"""
import json, os, resource, signal, sys
cfg = json.loads(sys.argv[1])
WORK = os.path.realpath(cfg["workdir"])

net = False
try:
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    net = libc.unshare(0x40000000) == 0  # CLONE_NEWNET
    del libc, ctypes
except Exception:
    net = False
for _m in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
    del sys.modules[_m]
with open(cfg["status"], "w") as f:
    f.write("1" if net else "0")

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes fail with EFBIG, not a signal
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_CPU, (cfg["cpu"], cfg["cpu"] + 1))
resource.setrlimit(resource.RLIMIT_AS, (cfg["mem"], cfg["mem"]))
resource.setrlimit(resource.RLIMIT_FSIZE, (cfg["fsize"], cfg["fsize"]))
resource.setrlimit(resource.RLIMIT_NPROC, (cfg["nproc"], cfg["nproc"]))

_exit, _write, _fspath, _realpath, _join, _getcwd, _isdir = (
    os._exit, os.write, os.fspath, os.path.realpath, os.path.join, os.getcwd, os.path.isdir)
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_ALLOWED_FILES = ("/dev/null",)
_PROCESS = {"os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "os.system",
            "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill",
            "resource.setrlimit", "resource.prlimit", "os.setuid", "os.setgid", "os.chroot"}
_BLOCKED_IMPORTS = {"ctypes", "_ctypes", "_posixsubprocess", "cffi", "_testcapi", "_xxsubinterpreters"}
_PATH_EVENTS = {"os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "os.chmod": 1, "os.chown": 1,
                "os.utime": 1, "os.truncate": 1, "os.rename": 2, "os.link": 2, "os.symlink": 2,
                "shutil.rmtree": 1, "shutil.copyfile": 2, "shutil.copymode": 2, "shutil.copystat": 2,
                "shutil.move": 2, "shutil.copytree": 2, "os.mkfifo": 1, "os.mknod": 1}

def _deny(code, what):
    try:
        _write(2, ("\nsandbox: refused " + what + "\n").encode("utf-8", "replace"))
    finally:
        _exit(code)

def _inside(path):
    if isinstance(path, int):
        return True
    try:
        p = _fspath(path)
        if isinstance(p, bytes):
            p = p.decode("utf-8", "surrogateescape")
        full = _realpath(_join(_getcwd(), p))
    except Exception:
        return False
    return full == WORK or full.startswith(WORK + "/") or full in _ALLOWED_FILES

def _is_outside_dir(path):
    try:
        p = _fspath(path)
        if isinstance(p, bytes):
            p = p.decode("utf-8", "surrogateescape")
        return _isdir(_join(_getcwd(), p))
    except Exception:
        return True

def _hook(event, args):
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
            (flags or 0) & _WRITE_FLAGS)
        if not _inside(path):
            if writing:
                _deny(112, "write outside the sandbox: " + repr(path))
            if _is_outside_dir(path):  # a directory fd would allow writes via dir_fd=
                _deny(112, "opening a directory outside the sandbox: " + repr(path))
    elif event in _PATH_EVENTS:
        for p in args[: _PATH_EVENTS[event]]:
            if not _inside(p):
                _deny(112, event + " outside the sandbox: " + repr(p))
    elif event.startswith("socket."):
        _deny(111, "network access (" + event + ")")
    elif event in _PROCESS:
        if event in ("os.kill", "os.killpg", "signal.pthread_kill") and args and args[0] == os.getpid():
            return
        _deny(113, "process control (" + event + ")")
    elif event == "import" and args[0].split(".")[0] in _BLOCKED_IMPORTS:
        _deny(113, "import of " + args[0])
    elif event.startswith("ctypes."):
        _deny(113, event)

sys.addaudithook(_hook)
os.chdir(WORK)
_src = open("main.py", encoding="utf-8").read()
_globals = {"__name__": "__main__", "__file__": "main.py", "__builtins__": __builtins__}
try:
    exec(compile(_src, "main.py", "exec"), _globals)
except MemoryError:
    _deny(114, "memory: MemoryError (limit reached)")
"""


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_capped(f: object, cap: int) -> str:
    f.seek(0)  # type: ignore[attr-defined]
    data: bytes = f.read(cap)  # type: ignore[attr-defined]
    return data.decode("utf-8", "replace")


def run_python(
    code: str,
    *,
    stdin: str = "",
    limits: SandboxLimits | None = None,
    files: dict[str, str] | None = None,
) -> SandboxResult:
    """Run `code` as `__main__` in a fresh sandbox; blocking (call it from a worker thread).

    `files` are extra text files written into the temp dir first (name -> content).
    """
    limits = limits or SandboxLimits()
    root = tempfile.mkdtemp(prefix="forgestream-sandbox-")
    work = os.path.join(root, "work")
    os.mkdir(work, 0o700)
    status_path = os.path.join(root, "status")
    start = time.monotonic()
    try:
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        for name, content in (files or {}).items():
            target = os.path.realpath(os.path.join(work, name))
            if not target.startswith(work + "/"):
                raise ValueError(f"sandbox file {name!r} escapes the work dir")
            with open(target, "w", encoding="utf-8") as f:
                f.write(content)
        cfg = {
            "workdir": work,
            "status": status_path,
            "cpu": max(1, int(limits.cpu_s)),
            "mem": int(limits.memory_mb) * 1024 * 1024,
            "fsize": int(limits.max_file_bytes),
            "nproc": int(limits.max_processes),
        }
        env = dict(_SAFE_ENV, HOME=work, TMPDIR=work)
        with (
            tempfile.TemporaryFile() as f_in,
            tempfile.TemporaryFile() as f_out,
            tempfile.TemporaryFile() as f_err,
        ):
            f_in.write(stdin.encode("utf-8"))
            f_in.seek(0)
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-S", "-B", "-u", "-c", _GUARD, json.dumps(cfg)],
                    stdin=f_in,
                    stdout=f_out,
                    stderr=f_err,
                    cwd=work,
                    env=env,
                    start_new_session=True,  # own session + process group, killed as a whole
                    close_fds=True,
                )
            except OSError as exc:
                return SandboxResult(False, "", f"could not start: {exc}", None, "error", 0.0)
            timed_out = False
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid)
                proc.wait()
            _kill_group(proc.pid)  # anything left in the group (there should be nothing)
            seconds = time.monotonic() - start
            stdout = _read_capped(f_out, limits.max_output_bytes)
            stderr = _read_capped(f_err, limits.max_output_bytes)
        rc = proc.returncode
        reason = _classify(rc, timed_out, stderr)
        try:
            with open(status_path) as f:
                isolated = f.read().strip() == "1"
        except OSError:
            isolated = False
        return SandboxResult(
            ok=reason is None,
            stdout=stdout,
            stderr=stderr,
            returncode=rc,
            killed_reason=reason,
            seconds=seconds,
            network_isolated=isolated,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _classify(rc: int | None, timed_out: bool, stderr: str) -> KilledReason | None:
    if timed_out:
        return "timeout"
    if rc == 0:
        return None
    if rc is not None and rc in _EXIT_CODES:
        return _EXIT_CODES[rc]
    if rc in (-signal.SIGXCPU, -signal.SIGKILL):  # SIGKILL we did not send: the hard CPU limit
        return "cpu"
    if "MemoryError" in stderr:
        return "memory"
    return "error"
