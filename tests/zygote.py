"""Python commands the tests start, forked from a pre-imported process instead of started
cold.

Most of the suite's CPU went to starting interpreters: every worker, CLI command, fake
API and helper script a test starts as a process imported SQLAlchemy, httpx, pydantic
and the runtime again (~1 s of CPU each, several hundred times per run). Here a test
process starts one server (``tests/zygote_server.py``) that imports them once, and
``subprocess.Popen`` (which ``subprocess.run`` and asyncio's subprocesses use) asks it
to fork the command instead of starting ``sys.executable`` anew. The command is still a
real process of its own: its pid, exit status, signals, kill -9, standard streams,
environment, working directory and import path are what they would be, and the test
process waits for it as for any child (it is re-parented here: this process is a child
subreaper).

Only ``sys.executable -m MODULE | -c CODE | SCRIPT`` without interpreter options is
forked, and only while the environment's interpreter and locale variables are those the
server started with; everything else (and any command whose environment sets
``SYNCKIT_TEST_COLD_START=1``, for tests that read what a cold interpreter imports)
starts as before. Unit tests never use it: ``conftest.py`` installs it for the
integration and end-to-end tests only.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

SERVER = Path(__file__).with_name("zygote_server.py")
#: The environment variables a cold interpreter reads at start-up (besides $PYTHONPATH,
#: $PYTHONDONTWRITEBYTECODE and $PYTHONUNBUFFERED, which the fork applies): a command
#: whose values differ from the server's starts cold.
_STARTUP_VARS = (
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "PYTHONHOME",
    "PYTHONIOENCODING",
    "PYTHONUTF8",
    "PYTHONDEVMODE",
    "PYTHONWARNINGS",
    "PYTHONSAFEPATH",
    "PYTHONNOUSERSITE",
    "PYTHONOPTIMIZE",
    "PYTHONHASHSEED",
    "PYTHONSTARTUP",
)
_PR_SET_CHILD_SUBREAPER = 36

_ColdPopen = subprocess.Popen


class _Server:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sock: socket.socket | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str | None] = {}
        self.broken = False

    def start(self) -> socket.socket | None:
        if self.sock is not None or self.broken:
            return self.sock
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with contextlib.suppress(OSError):
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 22)
        self.env = {k: os.environ.get(k) for k in _STARTUP_VARS}
        self.proc = _ColdPopen(
            [sys.executable, str(SERVER), str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        if ours.recv(16) != b"ready":
            self.broken = True
            return None
        self.sock = ours
        return ours

    def fork(self, request: dict[str, Any], fds: list[int]) -> int:
        with self.lock:
            sock = self.start()
            if sock is None:
                return -1
            try:
                socket.send_fds(sock, [json.dumps(request).encode()], fds)
                answer = sock.recv(4)
            except OSError:  # the server is gone: every command starts cold from here
                self.broken, self.sock = True, None
                return -1
        return struct.unpack("!i", answer)[0] if len(answer) == 4 else -1

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)


_server = _Server()


def _request(
    args: Any,
    executable: Any,
    env: Any,
    cwd: Any,
    preexec_fn: Any,
    pass_fds: Any,
    shell: bool,
    extra: tuple[Any, ...],
) -> dict[str, Any] | None:
    """What to ask the server for, or None: this command starts cold."""
    if shell or executable is not None or preexec_fn is not None or pass_fds:
        return None
    if any(x not in (None, -1, False) for x in extra):  # gid, gids, uid, umask, pgroup
        return None
    if isinstance(args, (str, bytes, os.PathLike)):
        return None
    argv = [os.fsdecode(a) for a in args]
    if len(argv) < 2 or argv[0] != sys.executable:
        return None
    env = dict(
        os.environ if env is None else {os.fsdecode(k): os.fsdecode(v) for k, v in env.items()}
    )
    if env.get("SYNCKIT_TEST_COLD_START") == "1":
        return None
    started = (
        _server.env if _server.sock is not None else {k: os.environ.get(k) for k in _STARTUP_VARS}
    )
    if any(env.get(k) != v for k, v in started.items()):
        return None
    first = argv[1]
    if first == "-m" and len(argv) >= 3:
        kind, target, rest = "module", argv[2], argv[3:]
    elif first == "-c" and len(argv) >= 3:
        kind, target, rest = "code", argv[2], argv[3:]
    elif not first.startswith("-") and first.endswith(".py"):
        kind, target, rest = "script", first, argv[2:]
    else:
        return None
    return {
        "kind": kind,
        "target": target,
        "argv": rest,
        "env": env,
        "cwd": None if cwd is None else os.fsdecode(cwd),
    }


class ForkedPopen(subprocess.Popen):  # type: ignore[type-arg]
    """``subprocess.Popen`` whose Python commands are forked by the server."""

    def _execute_child(  # type: ignore[override]
        self,
        args: Any,
        executable: Any,
        preexec_fn: Any,
        close_fds: Any,
        pass_fds: Any,
        cwd: Any,
        env: Any,
        startupinfo: Any,
        creationflags: Any,
        shell: Any,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        restore_signals: Any,
        gid: Any,
        gids: Any,
        uid: Any,
        umask: Any,
        start_new_session: bool,
        *more: Any,
    ) -> None:
        request = _request(
            args,
            executable,
            env,
            cwd,
            preexec_fn,
            pass_fds,
            shell,
            (gid, gids, uid, -1 if umask == -1 else umask, *more),
        )
        pid = -1
        if request is not None:
            request["session"] = bool(start_new_session)
            fds = [
                p2cread if p2cread != -1 else 0,
                c2pwrite if c2pwrite != -1 else 1,
                errwrite if errwrite != -1 else 2,
            ]
            pid = _server.fork(request, fds)
        if pid <= 0:
            super()._execute_child(  # type: ignore[misc]
                args,
                executable,
                preexec_fn,
                close_fds,
                pass_fds,
                cwd,
                env,
                startupinfo,
                creationflags,
                shell,
                p2cread,
                p2cwrite,
                c2pread,
                c2pwrite,
                errread,
                errwrite,
                restore_signals,
                gid,
                gids,
                uid,
                umask,
                start_new_session,
                *more,
            )
            return
        self.pid = pid
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # type: ignore[attr-defined]


_reaper = False


def install() -> None:
    """From here on, this process's ``subprocess.Popen`` forks Python commands."""
    global _reaper
    if subprocess.Popen is ForkedPopen or sys.platform != "linux":
        return
    if not _reaper:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return
        _reaper = True
    subprocess.Popen = ForkedPopen  # type: ignore[misc]


def uninstall() -> None:
    """Back to cold starts (the server stays, for the next test that forks)."""
    subprocess.Popen = _ColdPopen  # type: ignore[misc]


def stop() -> None:
    uninstall()
    _server.stop()
