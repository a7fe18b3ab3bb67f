"""The rdmaxfer command as a user meets it: --version, help and defaults on every argument,
closed choices, Ctrl-C (one line, exit 130) in any kind of wait, one-line warnings, and
``bench --json`` rows printed as they are measured."""

from __future__ import annotations

import argparse
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

import rdmaxfer
from rdmaxfer import _core
from rdmaxfer.tools.cli import _HelpFormatter, build_parser
from rdmaxfer.tools.cli_weights import EXIT_INTERRUPTED

#: Bound on any one wait of these tests (a child's start included) on a loaded machine.
WAIT_S = 120.0


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rdmaxfer", *args], capture_output=True, text=True, timeout=WAIT_S
    )


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "rdmaxfer", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def test_version_is_the_package_version() -> None:
    out = run("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"rdmaxfer {rdmaxfer.__version__}"
    assert rdmaxfer.__version__[0].isdigit()


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_argument_has_help_and_its_default() -> None:
    formatter = _HelpFormatter("rdmaxfer")
    missing = []
    for name, parser in _subcommands().items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            where = f"{name} {'/'.join(action.option_strings) or action.dest}"
            if not action.help:
                missing.append(f"{where}: no help")
            elif action.option_strings and action.nargs != 0:
                shown = formatter._get_help_string(action) or ""
                if "default" not in shown:
                    missing.append(f"{where}: no default in {shown!r}")
    assert not missing, "\n".join(missing)
    # The defaults shown are the real ones.
    serve = _subcommands()["serve"].format_help()
    assert "(default: 5555)" in serve and "(default: 127.0.0.1)" in serve


def test_closed_sets_are_choices() -> None:
    commands = _subcommands()
    transports = ["auto", *sorted(_core.available_transports())]
    for name in ("serve", "pull", "bench", "demo"):
        action = next(a for a in commands[name]._actions if a.dest == "transport")
        assert list(action.choices or ()) == transports, name
    out = run("pull", "127.0.0.1:1", "--transport", "infiniband")
    assert out.returncode == 2
    assert "argument --transport: invalid choice: 'infiniband'" in out.stderr
    out = run("serve", "x.safetensors", "--port", "70000")
    assert out.returncode == 2
    assert "--port: 70000 is out of range: give an integer from 0 to 65535" in out.stderr


def _interrupt(child: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGINT to a child that is in its wait; (stdout, stderr) once it exited."""
    child.send_signal(signal.SIGINT)
    try:
        return child.communicate(timeout=WAIT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def _assert_one_line(child: subprocess.Popen[str], err: str, command: str) -> None:
    assert child.returncode == EXIT_INTERRUPTED, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == f"rdmaxfer {command}: interrupted", err


def test_ctrl_c_in_pull_waiting_for_a_handshake() -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        silent.settimeout(WAIT_S)
        port = silent.getsockname()[1]
        child = start("pull", f"127.0.0.1:{port}", "--transport", "tcp", "--quiet")
        conn, _ = silent.accept()  # the child is connected and waits for the reply
        with conn:
            _, err = _interrupt(child)
    _assert_one_line(child, err, "pull")


@contextmanager
def stalling_http_server() -> Iterator[tuple[str, threading.Event]]:
    """An HTTP server whose handlers answer nothing until the test ends; yields its URL and
    an event set once a request arrived."""
    seen = threading.Event()
    release = threading.Event()

    class Stall(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.set()
            release.wait(WAIT_S)

        do_HEAD = do_GET

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stall)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/big.bin", seen
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join(WAIT_S)


def test_ctrl_c_in_fetch_of_a_slow_server() -> None:
    with stalling_http_server() as (url, seen):
        child = start("fetch", url, "--quiet")
        assert seen.wait(WAIT_S), "fetch sent no request"
        _, err = _interrupt(child)
    _assert_one_line(child, err, "fetch")


def test_ctrl_c_in_serve_and_its_warning_line(tmp_path: Path) -> None:
    """serve on every interface without a secret: the warning is one line naming the command
    (not a source line of rdmaxfer or of the `rdmaxfer` script); Ctrl-C stops it with its
    one line and exit 130."""
    path = tmp_path / "w.safetensors"
    save_file({"w": np.arange(64, dtype=np.float32)}, str(path))
    child = start("serve", str(path), "--host", "0.0.0.0", "--port", "0", "--transport", "tcp")
    assert child.stdout is not None
    ready = child.stdout.readline()
    assert ready.startswith("serving 1 tensors (256 bytes)"), ready
    out, err = _interrupt(child)
    assert child.returncode == EXIT_INTERRUPTED, err
    assert out.strip().splitlines() == ["stopped by SIGINT: server and engine closed"]
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(
        "rdmaxfer serve: warning: serving without a shared secret on 0.0.0.0:"
    ), err
    assert "any host that reaches" in lines[0] and "can connect and READ the 1 tensors" in lines[0]


def test_bench_json_streams_rows_as_measured_and_stops_on_ctrl_c() -> None:
    """A row is printed as soon as its size is measured: the first one arrives while the
    other 199 sizes (0.2 s each at least) still run; Ctrl-C then ends the benchmark, its
    peer process included, with one line."""
    sizes = ",".join(["1K"] * 200)
    child = start(
        "bench", "--transport", "tcp", "--size", sizes, "--duration", "0.2", "--warmup", "1",
        "--json",
    )  # fmt: skip
    assert child.stdout is not None
    first = json.loads(child.stdout.readline())
    assert first["bytes"] == 1024 and first["bw_avg_GB_per_s"] > 0 and first["transport"] == "tcp"
    out, err = _interrupt(child)
    _assert_one_line(child, err, "bench")
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) < 199 and all(r["bytes"] == 1024 for r in rows)


def test_bench_batch_json_rows() -> None:
    out = run("bench", "--transport", "tcp", "--batch", "8", "--size", "4K", "--iters", "2",
              "--json")  # fmt: skip
    assert out.returncode == 0, out.stderr
    (row,) = [json.loads(line) for line in out.stdout.splitlines()]
    assert row["case"] == "scattered" and row["entries"] == 8 and row["bytes"] == 8 * 4096
    assert row["batch_GB_per_s"] > 0 and row["ratio"] > 0
