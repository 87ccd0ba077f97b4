"""`eaglekit serve` in a child process on 127.0.0.1, for tests and benchmarks: start it on a free port, wait
until /health says ok, read JSON or the Prometheus text, stop it with SIGTERM (its drain path) and SIGKILL
only if it does not exit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from ..distributed import free_port


class LocalServer:
    """`args`: the `eaglekit serve` arguments after --host/--port (target, draft, device...). `log`: a file for
    the server's output (None: discarded). Raises RuntimeError if the server exits or is not up in time."""

    def __init__(
        self,
        args: list[str],
        log: str | Path | None = None,
        env: dict | None = None,
        startup_s: float = 120.0,
        cwd: str | Path | None = None,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "eaglekit.cli", "serve", "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.log = open(log, "w") if log else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            cmd, cwd=cwd, env=dict(os.environ, **(env or {})), stdout=self.log, stderr=self.log
        )
        deadline = time.monotonic() + startup_s
        while True:
            if self.proc.poll() is not None:
                self._close_log()
                raise RuntimeError(f"the server exited with {self.proc.returncode}" + (f" (log: {log})" if log else ""))
            try:
                if self.get("/health")["status"] == "ok":
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the server did not come up in {startup_s:.0f} s")
            time.sleep(0.2)

    def get(self, path: str):
        with urllib.request.urlopen(self.url + path, timeout=10) as r:
            body = r.read().decode()
        return body if path == "/metrics" else json.loads(body)

    def stop(self, timeout_s: float = 60.0) -> int | None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._close_log()
        return self.proc.returncode

    def _close_log(self):
        if self.log is not subprocess.DEVNULL and not self.log.closed:
            self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
