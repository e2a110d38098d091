"""The sandbox: hostile programs fail cleanly, are reported as what they are, and never hang."""

from __future__ import annotations

import os
import uuid

import pytest

from envs.sandbox import SandboxLimits, run_python

FAST = SandboxLimits(timeout_s=2.0, cpu_s=4, memory_mb=256)


def test_plain_program_runs_with_stdin_and_scrubbed_env() -> None:
    os.environ["FORGESTREAM_TEST_SECRET"] = "hunter2"
    try:
        code = (
            "import os, sys\nprint(sys.stdin.read().upper())\nprint(sorted(os.environ))\nprint(os.getcwd())"
        )
        result = run_python(code, stdin="abc", limits=FAST)
    finally:
        del os.environ["FORGESTREAM_TEST_SECRET"]
    assert result.ok and result.killed_reason is None and result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0] == "ABC"
    assert "FORGESTREAM_TEST_SECRET" not in result.stdout and "hunter2" not in result.stdout
    assert set(eval(lines[1])) <= {
        "PATH",
        "LANG",
        "LC_ALL",
        "PYTHONHASHSEED",
        "PYTHONIOENCODING",
        "HOME",
        "TMPDIR",
    }
    assert "forgestream-sandbox-" in lines[2]  # a private temp dir as cwd
    assert not os.path.exists(lines[2])  # removed afterwards


def test_writes_inside_the_temp_dir_are_allowed() -> None:
    result = run_python("open('x.txt', 'w').write('hi')\nprint(open('x.txt').read())", limits=FAST)
    assert result.ok and result.stdout.strip() == "hi"


@pytest.mark.timeout(20)
def test_infinite_loop_is_killed_on_the_wall_clock() -> None:
    result = run_python("while True:\n    pass", limits=SandboxLimits(timeout_s=1.0, cpu_s=5))
    assert not result.ok and result.killed_reason == "timeout" and result.returncode == -9
    assert result.seconds < 5


@pytest.mark.timeout(20)
def test_cpu_limit_ends_a_busy_loop() -> None:
    result = run_python("while True:\n    pass", limits=SandboxLimits(timeout_s=10.0, cpu_s=1))
    assert not result.ok and result.killed_reason == "cpu"
    assert result.seconds < 8


@pytest.mark.timeout(20)
def test_fork_bomb_is_refused() -> None:
    result = run_python("import os\nwhile True:\n    os.fork()", limits=FAST)
    assert not result.ok and result.killed_reason == "process"
    assert "os.fork" in result.stderr


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "code",
    [
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nos.system('true')",
        "import ctypes\nctypes.CDLL(None).fork()",
        "import os\nos.kill(1, 9)",
        "import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))",
    ],
)
def test_other_ways_out_are_refused(code: str) -> None:
    result = run_python(code, limits=FAST)
    assert not result.ok and result.killed_reason == "process", result.stderr


@pytest.mark.timeout(20)
def test_4gb_allocation_fails_cleanly() -> None:
    result = run_python("x = bytearray(4 * 1024**3)\nprint(len(x))", limits=FAST)
    assert not result.ok and result.killed_reason == "memory"
    assert result.stdout == ""


@pytest.mark.timeout(20)
def test_socket_connect_to_localhost_is_refused() -> None:
    code = "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 22))\nprint('connected')"
    result = run_python(code, limits=FAST)
    assert not result.ok and result.killed_reason == "network"
    assert "connected" not in result.stdout


@pytest.mark.timeout(20)
def test_catching_the_refusal_does_not_hide_it() -> None:
    code = "import socket\ntry:\n    socket.socket()\nexcept BaseException:\n    pass\nprint('survived')"
    result = run_python(code, limits=FAST)
    assert result.killed_reason == "network" and "survived" not in result.stdout


@pytest.mark.timeout(20)
def test_network_namespace_is_private_where_permitted() -> None:
    result = run_python("print('x')", limits=FAST)
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root here")
    assert result.network_isolated


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "code",
    [
        "open(TARGET, 'w').write('pwned')",
        "import os\nos.close(os.open(TARGET, os.O_WRONLY | os.O_CREAT))",
        "import os\nos.symlink(TARGET, 'link')\nopen('link', 'w').write('pwned')",  # realpath sees through
        "open('../' * 30 + TARGET.lstrip('/'), 'a').write('pwned')",
        # a directory fd outside would let dir_fd= writes through: opening it is refused
        "import os\nd = os.open(os.path.dirname(TARGET), os.O_RDONLY)\n"
        "os.close(os.open(os.path.basename(TARGET), os.O_WRONLY | os.O_CREAT, dir_fd=d))",
        "import os\nos.chdir('/')\nopen(TARGET.lstrip('/'), 'w').write('pwned')",
    ],
)
def test_write_outside_the_temp_dir_is_refused(code: str, tmp_path) -> None:
    target = str(tmp_path / f"outside-{uuid.uuid4().hex}.txt")
    result = run_python(f"TARGET = {target!r}\n" + code, limits=FAST)
    assert not result.ok and result.killed_reason == "filesystem", result.stderr
    assert not os.path.exists(target)


@pytest.mark.timeout(20)
def test_removing_files_outside_is_refused(tmp_path) -> None:
    victim = tmp_path / "keep.txt"
    victim.write_text("keep")
    result = run_python(f"import os\nos.remove({str(victim)!r})", limits=FAST)
    assert result.killed_reason == "filesystem" and victim.read_text() == "keep"


@pytest.mark.timeout(20)
def test_exceptions_and_output_caps() -> None:
    result = run_python("raise ValueError('boom')", limits=FAST)
    assert result.killed_reason == "error" and result.returncode == 1 and "ValueError: boom" in result.stderr
    flood = run_python(
        "import sys\nsys.stdout.write('x' * 10_000_000)", limits=SandboxLimits(max_output_bytes=1000)
    )
    assert len(flood.stdout) <= 1000
