"""Process faults (issue 13): a killed child, SIGTERM, SIGKILL of the server, a malformed ZeroMQ
frame, a stopped scheduler, aborts by exact rid, stop_regex over HTTP. Each test that breaks a
server starts its own."""

from __future__ import annotations

import glob
import os
import signal
import stat
import tempfile
import threading
import time

import pytest
import requests

from radixlm.runtime.server.testing import ServerProcess, child_pids

GREEDY = {"max_new_tokens": 6, "temperature": 0}


def _start(*extra: str) -> ServerProcess:
    from radixlm.runtime.tiny_model import tiny_model_path

    return ServerProcess(["--model-path", tiny_model_path(), *extra])


def _socket_dirs(pid: int) -> list[str]:
    return glob.glob(os.path.join(tempfile.gettempdir(), f"radixlm-{pid}-*"))


def _wait(cond, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return False


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _children(srv: ServerProcess) -> dict[str, int]:
    out = {}
    for pid in child_pids(srv.proc.pid):
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
        if name.startswith("radixlm-"):
            out[name] = pid
    return out


@pytest.fixture(scope="module")
def server():
    srv = _start("--health-timeout-s", "2")
    try:
        yield srv
    finally:
        srv.stop()


def test_socket_dir_is_private(server):
    (path,) = _socket_dirs(server.proc.pid)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert sorted(os.listdir(path)) == ["detok", "sched", "tok"]


def test_malformed_frame_is_dropped(server):
    import zmq

    (path,) = _socket_dirs(server.proc.pid)
    before = requests.post(server.url + "/generate", json={"text": "def f():", "sampling_params": GREEDY}).json()
    ctx = zmq.Context()
    try:
        for name in ("sched", "detok", "tok"):
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 2000)
            sock.connect(f"ipc://{path}/{name}")
            for frame in (b"\x80\x04garbage", b"\x81\xa7__msg__\xa4Evil", b"", b"\xc1"):
                sock.send(frame)
            sock.close()
    finally:
        ctx.term()
    time.sleep(0.5)
    after = requests.post(server.url + "/generate", json={"text": "def f():", "sampling_params": GREEDY}).json()
    assert after["output_ids"] == before["output_ids"]
    assert "dropped a malformed message" in server.log_tail(20000)


def test_abort_is_by_exact_rid(server):
    # NOTE: long enough that all three still run when the abort arrives, even on a fast machine
    long = {"max_new_tokens": 3000, "temperature": 0, "ignore_eos": True}
    results = {}

    def run(rid: str) -> None:
        results[rid] = requests.post(server.url + "/generate", json={"text": "x", "rid": rid, "sampling_params": long},
                                     timeout=120).json()

    threads = [threading.Thread(target=run, args=(rid,)) for rid in ("job", "job-1", "job-2")]
    for t in threads:
        t.start()
    time.sleep(0.5)
    assert requests.post(server.url + "/abort_request", json={"rid": "job"}).status_code == 200
    for t in threads:
        t.join(120)
    assert results["job"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert results["job-1"]["meta_info"]["finish_reason"]["type"] == "length"
    assert results["job-2"]["meta_info"]["finish_reason"]["type"] == "length"


def test_stop_regex_over_http(server):
    body = {"text": "def f():", "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}}
    free = requests.post(server.url + "/generate", json=body).json()["text"]
    assert len(free) > 4
    pattern = "(?s)" + "".join("\\" + c if not c.isalnum() else c for c in free[2:4])
    body["sampling_params"]["stop_regex"] = pattern
    out = requests.post(server.url + "/generate", json=body).json()
    assert out["text"] == free[:free.find(free[2:4])]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}


def test_stopped_scheduler_makes_health_fail(server):
    """SIGSTOP of the scheduler: /health answers 503 within --health-timeout-s; SIGCONT heals."""
    pid = _children(server)["radixlm-schedul"]
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        assert requests.get(server.url + "/health", timeout=30).status_code == 503
        assert time.monotonic() - t0 < 15
    finally:
        os.kill(pid, signal.SIGCONT)
    assert _wait(lambda: requests.get(server.url + "/health", timeout=30).status_code == 200)


def test_sigterm_exits_cleanly(server):
    """Last of the shared server's tests: SIGTERM -> exit 0, no child left, socket dir removed."""
    kids = _children(server)
    assert server.stop() == 0
    assert all(_wait(lambda p=p: _gone(p)) for p in kids.values())
    assert _socket_dirs(server.proc.pid) == []


@pytest.mark.parametrize("child", ["radixlm-schedul", "radixlm-detoken"])
def test_killed_child_stops_server_and_cleans_up(child):
    srv = _start()
    try:
        kids = _children(srv)
        assert child in kids, kids
        os.kill(kids[child], signal.SIGKILL)
        assert _wait(lambda: srv.proc.poll() is not None), "the server kept running without its " + child
        assert srv.proc.returncode == 1
        assert all(_wait(lambda p=p: _gone(p)) for p in kids.values())
        assert _socket_dirs(srv.proc.pid) == []
    finally:
        srv.stop()


def test_sigkill_of_server_leaves_nothing():
    srv = _start()
    try:
        kids = _children(srv)
        assert len(_socket_dirs(srv.proc.pid)) == 1
        srv.proc.kill()
        srv.proc.wait(30)
        assert all(_wait(lambda p=p: _gone(p)) for p in kids.values()), "children outlived the server"
        assert _wait(lambda: _socket_dirs(srv.proc.pid) == []), "socket dir left behind"
    finally:
        srv.stop()
