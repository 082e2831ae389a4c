"""Run a real server as a subprocess (tests, benchmarks): free port, wait for ``/health``, stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux ``/proc``)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid and fields[0] != "Z":
                    out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


class ServerProcess:
    """``radixlm serve --device cpu --port <free> *args`` in a subprocess.

    Args:
        args: extra CLI args (e.g. ``["--api-key", "k"]``).
        ready_timeout: seconds to wait for ``/health``; raises ``RuntimeError`` with the log tail
            when the server exits or is not ready by then.
    """

    def __init__(self, args: list[str] = (), ready_timeout: float = 180.0, env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="radixlm-server-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "radixlm.cli", "serve", "--device", "cpu", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env or os.environ.copy())
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server not ready after {ready_timeout} s:\n{self.log_tail()}")
            time.sleep(0.25)

    def log_tail(self, chars: int = 4000) -> str:
        with open(self.log.name) as f:
            return f.read()[-chars:]

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
