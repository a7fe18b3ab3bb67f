"""A throwaway nginx on a loopback port serving one directory (honours HTTP Range requests).

Used by tests/test_fetch.py (fixture) and bench/fetch_bench.py. nginx runs in the foreground
(``daemon off``) as the current user with every path (config, pid, logs, temp dirs) inside a
work directory, and is stopped with SIGTERM (SIGKILL after 10 s) by :meth:`Nginx.stop`.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from _ports import free_port

#: Seconds to wait for nginx to accept connections.
START_TIMEOUT_S = 15.0


def nginx_binary() -> str | None:
    """Path of the nginx executable (PATH, then /usr/sbin), or None."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


class Nginx:
    """nginx serving ``root`` on ``host`` (127.0.0.1); ``extra`` is added inside the
    ``server`` block; ``prefix`` goes before the command (``["ip", "netns", "exec", NS]`` runs
    it in a network namespace whose address ``host`` is); ``tls`` (certificate, key) makes it
    ``https`` with HTTP/2."""

    def __init__(
        self,
        root: Path,
        work: Path,
        extra: str = "",
        host: str = "127.0.0.1",
        prefix: Sequence[str] = (),
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        binary = nginx_binary()
        if binary is None:
            raise FileNotFoundError("nginx is not installed: apt-get install -y nginx")
        self.root = root
        self.work = work
        self.host = host
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        for _ in range(3):  # the port picked may be taken between picking and binding
            self.port = free_port()
            conf = self._write_config(extra)
            log = (work / "nginx.out").open("wb")
            self.proc = subprocess.Popen(
                [*prefix, binary, "-p", str(work), "-e", str(work / "error.log"), "-c", str(conf)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            log.close()
            if self._wait_ready():
                return
            self.stop()
        raise RuntimeError(f"nginx did not start; see {work}/error.log and {work}/nginx.out")

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` or ``https://HOST:PORT`` (no trailing slash)."""
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def _write_config(self, extra: str) -> Path:
        w = self.work
        for sub in ("client", "proxy", "fastcgi", "uwsgi", "scgi"):
            (w / sub).mkdir(parents=True, exist_ok=True)
        user = "user root;\n" if os.geteuid() == 0 else ""
        listen = ""
        if self.tls is not None:
            cert, key = self.tls
            listen = (
                f" ssl http2;\n        ssl_certificate {cert};\n        ssl_certificate_key {key}"
            )
        conf = w / "nginx.conf"
        conf.write_text(
            f"""daemon off;
master_process on;
worker_processes 2;
{user}pid {w}/nginx.pid;
error_log {w}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {w}/client;
    proxy_temp_path {w}/proxy;
    fastcgi_temp_path {w}/fastcgi;
    uwsgi_temp_path {w}/uwsgi;
    scgi_temp_path {w}/scgi;
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 100000;
    server {{
        listen {self.host}:{self.port}{listen};
        root {self.root};
        location / {{ }}
{extra}
    }}
}}
"""
        )
        return conf

    def _wait_ready(self) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    return True
            except OSError:
                time.sleep(0.05)
        return False

    def stop(self) -> None:
        """Stop nginx (SIGTERM, then SIGKILL after 10 s); idempotent."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self) -> Nginx:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
