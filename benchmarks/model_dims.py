"""Shared pieces of the GPU micro-benchmarks that run a model of given dimensions with dummy
weights: choosing the model folder, timing a captured CUDA graph, and printing result tables."""

from __future__ import annotations

import argparse
import os


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """``--write-config NAME DIR`` (a published config from bench_offline.PUBLISHED) or
    ``--config-dir DIR`` (any folder with a config.json)."""
    ap.add_argument("--write-config", nargs=2, metavar=("NAME", "DIR"), default=None)
    ap.add_argument("--config-dir", default=None, help="a model folder with config.json (dummy weights)")


def model_dir(ap: argparse.ArgumentParser, a: argparse.Namespace) -> tuple[str, str]:
    """``(folder, display name)`` from the arguments of :func:`add_model_args`; exits with a usage
    error unless exactly one of them was given."""
    if (a.write_config is None) == (a.config_dir is None):
        ap.error("pass exactly one of --write-config and --config-dir")
    if a.write_config:
        from bench_offline import write_config

        return write_config(*a.write_config), a.write_config[0]
    return a.config_dir, os.path.basename(os.path.normpath(a.config_dir))


def replay_ms(graph, iters: int, warmup: int = 5) -> float:
    """Mean milliseconds of one ``graph.replay()`` (a ``torch.cuda.CUDAGraph``) over ``iters``
    back-to-back replays, timed with CUDA events after ``warmup`` replays."""
    import torch

    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


class Out:
    """Prints lines and appends them to a file (flushed per line)."""

    def __init__(self, path: str | None) -> None:
        self.f = open(path, "w") if path else None

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        if self.f:
            self.f.write(line + "\n")
            self.f.flush()
