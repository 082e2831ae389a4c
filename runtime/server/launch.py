"""Process topology of the server (DESIGN.md §2): start the scheduler and detokenizer processes,
wait until each reports ready, then serve HTTP from this process with the TokenizerManager.

Shutdown: SIGINT/SIGTERM stop the HTTP server, then the children are terminated (and killed if
they linger) and the private socket directory is removed; if this process is killed, the kernel
sends the children SIGTERM and they remove the socket directory (and the next server start removes
any directory whose server pid is gone). If a child dies
while serving, the server logs which one and how, and exits with status 1.

Tensor parallelism (``--tp-size N``, ``--nnodes``, ``--node-rank``, ``--dist-init-addr``): each node
starts the scheduler processes of its ``N / nnodes`` ranks, which meet through torch.distributed's
rendezvous at ``tcp://<dist-init-addr>``; node 0 also runs the detokenizer and serves HTTP, the
other nodes only follow. A dead rank (any scheduler child) ends the server as above.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import wait as wait_sentinels

from radixlm.runtime.distributed import default_init_method
from radixlm.runtime.server.config import ServerConfig
from radixlm.runtime.server.detokenizer_process import run_detokenizer_process
from radixlm.runtime.server.io_struct import IpcPaths
from radixlm.runtime.server.procs import freeze_startup_objects, setup_logging
from radixlm.runtime.server.profiling import maybe_profile
from radixlm.runtime.server.scheduler_process import run_scheduler_process

logger = logging.getLogger("radixlm.launch")


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


class ServerProcesses:
    """The child processes of one server instance: one scheduler per TP rank of this node
    (``scheduler`` is rank 0, ``scheduler-tp<r>`` rank r) and, on node 0, the detokenizer."""

    def __init__(self, config: ServerConfig, paths: IpcPaths) -> None:
        ctx = mp.get_context("spawn")
        self.paths = paths
        self.readers: dict[str, object] = {}
        self.procs: dict[str, mp.Process] = {}
        self.stopping = False
        tok_path = config.tokenizer_path or config.model_path
        engine_args = config.engine_args()
        node_rank, per_node = config.node_rank, config.tp_size // config.nnodes
        init_method = default_init_method(config.dist_init_addr) if config.tp_size > 1 else None
        targets: dict[str, tuple] = {}
        for rank in range(node_rank * per_node, (node_rank + 1) * per_node):
            name = "scheduler" if rank == 0 else f"scheduler-tp{rank}"
            targets[name] = (run_scheduler_process, (engine_args,), (rank, init_method))
        if node_rank == 0:
            targets["detokenizer"] = (run_detokenizer_process, (tok_path, config.log_level), ())
        for name, (fn, args, tail) in targets.items():
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=fn, args=(*args, paths, writer, *tail), name=f"radixlm-{name}", daemon=True)
            proc.start()
            writer.close()
            self.procs[name], self.readers[name] = proc, reader

    def wait_ready(self, timeout_s: float, stop: threading.Event | None = None) -> dict[str, dict]:
        """Block until every child reported ready; returns their reports.
        Raises ``RuntimeError`` naming the child that failed, died or timed out, and
        ``InterruptedError`` when ``stop`` is set meanwhile."""
        deadline = time.monotonic() + timeout_s
        reports: dict[str, dict] = {}
        for name, reader in self.readers.items():
            proc = self.procs[name]
            while True:
                if reader.poll(0.2):
                    try:
                        msg = reader.recv()
                    except EOFError:
                        proc.join(5)
                        raise RuntimeError(f"{name} process {_describe_exit(proc.exitcode)} during startup") from None
                    if msg.get("status") != "ready":
                        raise RuntimeError(f"{name} process failed to start:\n{msg.get('message')}")
                    reports[name] = msg
                    break
                if stop is not None and stop.is_set():
                    raise InterruptedError("stopped during startup")
                if not proc.is_alive():
                    raise RuntimeError(f"{name} process {_describe_exit(proc.exitcode)} during startup")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} process not ready after {timeout_s:.0f} s")
        return reports

    def watch(self) -> None:
        """Start a thread that exits this process with status 1 when any child dies."""
        def run() -> None:
            ready = wait_sentinels([p.sentinel for p in self.procs.values()])
            if self.stopping:
                return
            for name, proc in self.procs.items():
                if proc.sentinel in ready:
                    proc.join(2)  # NOTE: the sentinel closes a moment before the child is reapable
                    logger.error("%s process (pid %d) %s; shutting the server down", name, proc.pid,
                                 _describe_exit(proc.exitcode))
            self.shutdown()
            logging.shutdown()
            os._exit(1)

        threading.Thread(target=run, name="radixlm-watchdog", daemon=True).start()

    def shutdown(self, grace_s: float = 3.0) -> None:
        """Terminate every child, kill those still alive ``grace_s`` seconds later (in total, not
        per child: a rank blocked in a collective may not see SIGTERM) and remove the IPC files;
        idempotent."""
        self.stopping = True
        for proc in self.procs.values():
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + grace_s
        for proc in self.procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs.values():
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        self.paths.remove()


def launch_server(config: ServerConfig) -> int:
    """Run a server until SIGINT/SIGTERM. Returns the exit status (0 after a clean shutdown)."""
    setup_logging(config.log_level, "server")
    from radixlm.runtime.default_model import resolve_model_path

    config = dataclasses.replace(config, model_path=resolve_model_path(config.model_path))
    paths = IpcPaths.new()
    children = ServerProcesses(config, paths)
    stop_requested = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop_requested.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        from transformers import AutoTokenizer  # NOTE: loads while the children boot

        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path or config.model_path)
        try:
            reports = children.wait_ready(config.ready_timeout_s, stop_requested)
        except RuntimeError as e:
            logger.error("%s", e)
            return 1
        except InterruptedError:
            return 0
        children.watch()
        if config.node_rank > 0:  # NOTE: only TP ranks here; node 0 serves HTTP
            logger.info("node %d: TP ranks ready, following node 0", config.node_rank)
            while not stop_requested.wait(0.5):
                pass
            return 0
        _serve(config, paths, tokenizer, reports["scheduler"])
        return 0
    finally:
        children.shutdown()
        for s, handler in previous.items():
            signal.signal(s, handler)


def _serve(config: ServerConfig, paths: IpcPaths, tokenizer, info: dict) -> None:
    import uvicorn

    from radixlm.runtime.server.http_native import create_app
    from radixlm.runtime.server.tokenizer_manager import TokenizerManager

    tm = TokenizerManager(config, paths, tokenizer, info)
    app = create_app(tm)
    uv_config = uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level.lower(),
                               access_log=False, timeout_graceful_shutdown=3, timeout_keep_alive=30)
    server = uvicorn.Server(uv_config)

    async def main() -> None:
        tm.start()
        maybe_profile("http", at_exit=True)  # NOTE: RADIXLM_CPROFILE_DIR only
        freeze_startup_objects()  # NOTE: tokenizer, transformers, torch, the app: out of full collections
        logger.info("serving %s on http://%s:%d (scheduler info: %s)", config.model_path, config.host,
                    config.port, info)
        await server.serve()

    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(main())


def main(argv: list[str] | None = None) -> None:
    """``python -m radixlm.launch_server [server args]``."""
    import argparse

    from radixlm.runtime.server.config import add_cli_args, config_from_namespace

    parser = argparse.ArgumentParser(prog="radixlm serve", description="Serve a model over HTTP.")
    add_cli_args(parser)
    config = config_from_namespace(parser.parse_args(argv))
    sys.exit(launch_server(config))
