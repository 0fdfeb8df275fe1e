"""Running untrusted generated code: a separate, isolated, resource-limited process.

Generated code never runs in the evaluating process. Each program runs in a fresh Python
interpreter (`-I -S`: no user site, no site-packages, no PYTHON* variables) with:

* an empty environment (no secrets to read) and a fresh temporary working directory that is
  deleted afterwards (files it writes go there, at most `file_mb` each);
* resource limits: address space (`memory_mb`), CPU seconds, file size, open files;
* its own session (process group): on the wall-clock timeout the whole group is killed;
* where the kernel allows it (running as root), no network (a fresh network namespace);
* a guard that disables the obvious ways out before the program runs, as HumanEval's own
  harness does: no processes (`fork`, `exec`, `subprocess`, `os.system`), no signals to
  others, no writing, deleting or renaming files outside its folder, no `ctypes`.

This is defence in depth for benchmark code from small models, not a security boundary for
hostile code: run evaluations on a machine you can afford to lose, as OpenAI's HumanEval
README also advises.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

_GUARD = r"""
import os, posix, shutil, subprocess, sys
def _blocked(*args, **kwargs):
    raise PermissionError("blocked by the ensemble-llm sandbox")
for _module in (os, posix):
    for _name in ("system", "kill", "killpg", "putenv", "unsetenv", "fchdir", "chroot", "setuid", "setgid",
                  "remove", "removedirs", "rmdir", "unlink", "rename", "renames", "replace", "truncate",
                  "execv", "execve", "execvp", "execvpe", "spawnv", "spawnve", "posix_spawn", "posix_spawnp",
                  "forkpty", "fork"):
        if hasattr(_module, _name):
            setattr(_module, _name, _blocked)
shutil.rmtree = shutil.move = shutil.chown = _blocked
import builtins, io
_here = os.path.realpath(os.getcwd())
def _inside(path):
    if isinstance(path, int):
        return True
    real = os.path.realpath(os.fsdecode(path))
    return real == _here or real.startswith(_here + os.sep)
_open, _os_open = builtins.open, os.open
def _guarded_open(file, mode="r", *args, **kwargs):
    if any(flag in mode for flag in "wax+") and not _inside(file):
        raise PermissionError("writing outside its folder is blocked by the ensemble-llm sandbox")
    return _open(file, mode, *args, **kwargs)
def _guarded_os_open(path, flags, *args, **kwargs):
    if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC) and not _inside(path):
        raise PermissionError("writing outside its folder is blocked by the ensemble-llm sandbox")
    return _os_open(path, flags, *args, **kwargs)
builtins.open = io.open = _guarded_open
os.open = posix.open = _guarded_os_open
subprocess.Popen = subprocess.run = subprocess.call = subprocess.check_output = _blocked
for _name in ("ctypes", "_ctypes", "resource", "_posixsubprocess", "multiprocessing", "signal"):
    sys.modules[_name] = None
del _blocked, _name, _module
"""


@dataclass(frozen=True)
class SandboxResult:
    """How a program ended.

    Attributes:
        status: "passed" (exit code 0), "failed" (non-zero exit), or "timeout".
        detail: the last lines of its stderr (for failures), or what stopped it.
        seconds: wall seconds it ran.
    """

    status: str
    detail: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass(frozen=True)
class Limits:
    """What one program may use."""

    timeout: float = 10.0
    memory_mb: int = 1024
    file_mb: int = 16
    open_files: int = 64


# The limits are applied by a fresh, single-threaded interpreter that then replaces itself with
# the program (exec): forking a process that runs torch's thread pools and calling into libc
# before exec (`preexec_fn`) can deadlock the child, so the evaluating process never does.
_LAUNCHER = r"""
import ctypes, os, resource, sys
memory_mb, file_mb, cpu_seconds, open_files, no_network, program = sys.argv[1:]
if no_network == "1":
    try:
        ctypes.CDLL(None, use_errno=True).unshare(0x40000000)  # CLONE_NEWNET: a namespace with no interfaces
    except (OSError, AttributeError):
        pass
megabyte = 1024 * 1024
resource.setrlimit(resource.RLIMIT_AS, (int(memory_mb) * megabyte,) * 2)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(file_mb) * megabyte,) * 2)
resource.setrlimit(resource.RLIMIT_CPU, (int(cpu_seconds),) * 2)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(open_files),) * 2)
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
os.execv(sys.executable, [sys.executable, "-I", "-S", program])
"""


def run_isolated(program: str, limits: Limits | None = None) -> SandboxResult:
    """Run `program` (Python source) in a sandboxed child process; see the module docstring."""
    limits = limits or Limits()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ensemble-llm-sandbox-") as folder:
        path = os.path.join(folder, "program.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(_GUARD + "\n" + program)
        arguments = (limits.memory_mb, limits.file_mb, int(limits.timeout) + 1, limits.open_files)
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _LAUNCHER, *map(str, arguments), str(int(os.geteuid() == 0)), path],
            cwd=folder,
            env={},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # its own process group: a timeout kills all it started
        )
        try:
            _, stderr = process.communicate(timeout=limits.timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            process.communicate()
            return SandboxResult("timeout", f"ran past {limits.timeout:g} s", time.perf_counter() - started)
        finally:
            _kill_group(process)  # forked children that outlived their parent
    seconds = time.perf_counter() - started
    # Without its temporary folder a traceback reads the same on every run (and `--rescore` can
    # tell a changed score from a changed folder name).
    text = stderr.decode("utf-8", errors="replace").replace(folder + os.sep, "")
    detail = "\n".join(text.strip().splitlines()[-6:])
    if process.returncode == 0:
        return SandboxResult("passed", "", seconds)
    if process.returncode < 0:
        name = signal.Signals(-process.returncode).name
        return SandboxResult("failed", f"killed by {name}" + (f": {detail}" if detail else ""), seconds)
    return SandboxResult("failed", detail, seconds)


def _kill_group(process: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
