"""The process ``tests/zygote.py`` starts once per test process: it imports what synckit's
commands import (SQLAlchemy, both engines' drivers, httpx, pydantic, structlog, the
runtime) once, then forks a fresh process for each Python command a test starts.

Each request comes over a Unix socket with the child's stdin, stdout and stderr as file
descriptors. The fork is doubled: the intermediate process exits at once, so the command's
process is re-parented to the test process (a child subreaper, ``tests/zygote.py``),
which waits for it, signals it and reads its exit status exactly as for a process
``subprocess.Popen`` started itself. The command then runs as ``python -m``, ``python -c``
or ``python SCRIPT`` would run it: its own argv, environment, working directory, import
path, standard streams and exit status.
"""

from __future__ import annotations

import atexit
import gc
import io
import json
import os
import runpy
import signal
import socket
import struct
import sys
import threading
import traceback
import types

_OWN_PATH = {sys.path[0], *os.environ.get("PYTHONPATH", "").split(os.pathsep)}
#: The interpreter's own import path (the standard library, the venv's site-packages),
#: without this script's folder and without the $PYTHONPATH this process started with.
BASE_PATH = [p for p in sys.path[1:] if p and p not in _OWN_PATH]
#: The variables that choose the CAs of httpx's default TLS context, and this process's.
_TLS_ENV = ("SSL_CERT_FILE", "SSL_CERT_DIR")
_ZYGOTE_ENV = dict(os.environ)


def _preimport() -> None:
    from synckit.cli.options import without_rich

    # As `synckit worker` imports them: without rich (synckit.cli.options.without_rich).
    with without_rich():
        import aiosqlite  # noqa: F401
        import asyncpg  # noqa: F401
        import sqlalchemy.dialects.postgresql.asyncpg
        import sqlalchemy.dialects.sqlite.aiosqlite  # noqa: F401

        import synckit.app
        import synckit.cli
        import synckit.cli.worker
        import synckit.testing.hostile  # noqa: F401
        from synckit.runtime.http.transports import tls_context

    # The default TLS context (the CA bundle loaded: ~50 ms of CPU), which every worker
    # builds as it starts (synckit.runtime.sync.context.prepare_process), built once here
    # and inherited. A command whose environment names other CAs builds its own (_run).
    tls_context()
    # What the imports made is frozen: no collection in a forked command walks it again.
    gc.collect()
    gc.freeze()


def _stream(fd: int, like: io.TextIOWrapper, write: bool, unbuffered: bool) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w" if write else "r", closefd=False)
    buffered: io.BufferedIOBase = io.BufferedWriter(raw) if write else io.BufferedReader(raw)
    return io.TextIOWrapper(
        buffered,
        encoding=like.encoding,
        errors=like.errors,
        line_buffering=write and (fd == 2 or raw.isatty()),
        write_through=write and unbuffered,
    )


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _finish(code: int, then: signal.Signals | None = None) -> None:
    """What the interpreter does on its way out: wait for threads, run atexit, flush;
    ``then``: end by that signal instead of an exit status."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except Exception:
        traceback.print_exc()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = code or 120
    if then is not None:
        signal.signal(then, signal.SIG_DFL)
        os.kill(os.getpid(), then)
    os._exit(code)


def _run(request: dict[str, object], fds: list[int]) -> None:
    """In the command's process: become it, run it, exit with its status."""
    try:
        if request["session"]:
            os.setsid()
        for target, fd in enumerate(fds):
            if fd != target:
                os.dup2(fd, target)
        os.closerange(3, 1 << 16)
        cwd = request["cwd"]
        if isinstance(cwd, str):
            os.chdir(cwd)
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        if any(env.get(name) != _ZYGOTE_ENV.get(name) for name in _TLS_ENV):
            from synckit.runtime.http.transports import tls_context

            tls_context.cache_clear()
        extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        kind, target_name = request["kind"], request["target"]
        assert isinstance(target_name, str)
        argv = request["argv"]
        assert isinstance(argv, list)
        first = os.path.dirname(os.path.abspath(target_name)) if kind == "script" else ""
        if kind == "module":
            first = os.getcwd()
        sys.path[:] = [first, *extra, *BASE_PATH]
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
        unbuffered = bool(env.get("PYTHONUNBUFFERED"))
        sys.stdin = sys.__stdin__ = _stream(0, sys.__stdin__, False, unbuffered)  # type: ignore[arg-type]
        sys.stdout = sys.__stdout__ = _stream(1, sys.__stdout__, True, unbuffered)  # type: ignore[arg-type]
        sys.stderr = sys.__stderr__ = _stream(2, sys.__stderr__, True, unbuffered)  # type: ignore[arg-type]
    except BaseException:
        os._exit(127)
    code = 0
    try:
        if kind == "module":
            sys.argv = ["-m", *argv]
            runpy.run_module(target_name, run_name="__main__", alter_sys=True)
        elif kind == "code":
            sys.argv = ["-c", *argv]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(target_name, "<string>", "exec"), main.__dict__)
        else:
            sys.argv = [target_name, *argv]
            runpy.run_path(target_name, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc)
    except KeyboardInterrupt as exc:
        _print_uncaught(exc)
        # As the interpreter does: an uncaught Ctrl-C ends the process by SIGINT.
        _finish(0, then=signal.SIGINT)
    except BaseException as exc:
        _print_uncaught(exc)
        code = 1
    _finish(code)


def _print_uncaught(exc: BaseException) -> None:
    """The traceback the interpreter prints, without this module's frame."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    traceback.print_exception(type(exc), exc, tb)


def serve(sock: socket.socket) -> None:
    while True:
        try:
            message, fds, _flags, _addr = socket.recv_fds(sock, 1 << 22, 3)
        except (ConnectionError, OSError):
            return
        if not message:
            return
        request = json.loads(message)
        read, write = os.pipe()
        middle = os.fork()
        if middle == 0:
            os.close(read)
            pid = os.fork()
            if pid == 0:
                os.close(write)
                sock.close()
                _run(request, fds)
            os.write(write, struct.pack("!i", pid))
            os._exit(0)
        os.close(write)
        answer = os.read(read, 4)
        os.close(read)
        os.waitpid(middle, 0)
        for fd in fds:
            os.close(fd)
        sock.sendall(answer if len(answer) == 4 else struct.pack("!i", -1))


if __name__ == "__main__":
    channel = socket.socket(fileno=int(sys.argv[1]))
    _preimport()
    channel.sendall(b"ready")
    serve(channel)
