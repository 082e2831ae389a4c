"""Tensor-parallel process group over ``torch.distributed`` (NCCL on CUDA, gloo on CPU).

One process per rank; the TP group is the whole world (``tp_size = nnodes * ranks per node``).
Rank ``r`` of a node uses GPU ``r % ranks_per_node`` on CUDA. Besides the device group (NCCL on
CUDA) a gloo group on the CPU carries the small Python objects the schedulers exchange (SGLang's
``cpu_group``: ``broadcast_object_list`` over NCCL would stage the pickles through the GPU).

Without :func:`init_distributed` (or with ``tp_size == 1``) every accessor reports rank 0 of 1 and
every collective is a no-op, so single-device code pays nothing. Names follow SGLang/vLLM
(``get_tensor_model_parallel_rank``, ``tensor_model_parallel_all_reduce``, ...).
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class _TPGroup:
    rank: int
    world_size: int
    local_rank: int
    backend: str
    device_group: object
    cpu_group: object
    prev_threads: int


_TP: _TPGroup | None = None


def init_distributed(
    tp_size: int,
    rank: int,
    init_method: str,
    device: str = "cpu",
    ranks_per_node: int | None = None,
    timeout_s: float = 1800.0,
) -> None:
    """Join the TP group as ``rank`` of ``tp_size`` through torch.distributed's rendezvous.

    Args:
        tp_size: number of ranks (world size), >= 1; 1 sets up nothing.
        rank: this process's global rank in ``[0, tp_size)``.
        init_method: rendezvous address, e.g. ``tcp://10.0.0.1:29500`` (rank 0 listens there).
        device: ``cpu`` (gloo; each rank then uses ``cpu_count // ranks_per_node`` torch threads)
            or ``cuda``/``cuda:N`` (NCCL; the GPU is ``local_rank``).
        ranks_per_node: ranks on this node (default ``tp_size``, one node); sets ``local_rank``.
        timeout_s: collective timeout in seconds (a rank waiting longer on a peer raises).
    Raises ``ValueError`` for a rank outside the group and ``RuntimeError`` when a group is
    already set up.
    """
    global _TP
    if _TP is not None:
        raise RuntimeError("the tensor-parallel group is already initialized")
    if not 0 <= rank < tp_size:
        raise ValueError(f"rank must be in [0, {tp_size}), got {rank}")
    if tp_size == 1:
        return
    per_node = ranks_per_node or tp_size
    local_rank = rank % per_node
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.set_device(local_rank)
    prev_threads = torch.get_num_threads()
    if not cuda:  # NOTE: the node's ranks share its cores; oversubscribed OpenMP threads spin against each other
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // per_node))
    backend = "nccl" if cuda else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend, init_method=init_method, world_size=tp_size, rank=rank, timeout=timeout)
    cpu_group = dist.new_group(backend="gloo", timeout=timeout) if cuda else dist.group.WORLD
    _TP = _TPGroup(rank, tp_size, local_rank, backend, dist.group.WORLD, cpu_group, prev_threads)


def destroy_distributed() -> None:
    """Leave and tear down the TP group (no-op when none is set up); restores the torch thread
    count :func:`init_distributed` changed."""
    global _TP
    if _TP is None:
        return
    torch.set_num_threads(_TP.prev_threads)
    _TP = None
    if dist.is_initialized():
        dist.destroy_process_group()


def get_tensor_model_parallel_rank() -> int:
    """This process's TP rank (0 without a group)."""
    return _TP.rank if _TP is not None else 0


def get_tensor_model_parallel_world_size() -> int:
    """The TP size (1 without a group)."""
    return _TP.world_size if _TP is not None else 1


def get_local_rank() -> int:
    """This rank's index on its node (its GPU on CUDA); 0 without a group."""
    return _TP.local_rank if _TP is not None else 0


def local_device(device: str) -> str:
    """``device`` as this rank uses it: ``cuda`` (or any ``cuda:N``) becomes ``cuda:<local_rank>``
    under TP."""
    if _TP is not None and device.startswith("cuda"):
        return f"cuda:{_TP.local_rank}"
    return device


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    """Sum ``x`` over the TP ranks in place and return it (``x`` itself at TP 1).

    Works inside a CUDA graph capture on NCCL (the collective is recorded into the graph)."""
    if _TP is None:
        return x
    dist.all_reduce(x, group=_TP.device_group)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's ``x`` (same shape on all ranks) along ``dim`` in rank order.

    Returns ``x`` at TP 1; otherwise a new tensor whose ``dim`` is ``world_size`` times larger,
    bitwise identical on every rank."""
    if _TP is None:
        return x
    n = _TP.world_size
    x = x.contiguous()
    if _TP.backend == "nccl":
        out = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_gather_into_tensor(out, x, group=_TP.device_group)
        parts = out.chunk(n, dim=0)
    else:
        parts = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(parts, x, group=_TP.device_group)
    return torch.cat(parts, dim=dim)


def broadcast_objects(objs: list | None, src: int = 0) -> list:
    """Broadcast a picklable Python list from rank ``src`` over the CPU group; returns it on
    every rank (other ranks pass ``None``). At TP 1 returns ``objs`` unchanged."""
    if _TP is None:
        return objs
    box = [objs if _TP.rank == src else None]
    dist.broadcast_object_list(box, src=src, group=_TP.cpu_group)
    return box[0]


def all_reduce_min(value: int) -> int:
    """The minimum of an integer over the TP ranks (e.g. the KV pool size every rank can hold)."""
    if _TP is None:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MIN, group=_TP.cpu_group)
    return int(t.item())


def free_port() -> int:
    """A free TCP port on this host (for a single-node ``tcp://127.0.0.1:PORT`` rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_init_method(dist_init_addr: str | None) -> str:
    """``tcp://HOST:PORT`` from ``--dist-init-addr`` (``HOST:PORT``), else a free local port."""
    if dist_init_addr:
        return dist_init_addr if "://" in dist_init_addr else f"tcp://{dist_init_addr}"
    return f"tcp://127.0.0.1:{free_port()}"


__all__ = [
    "init_distributed", "destroy_distributed", "get_tensor_model_parallel_rank",
    "get_tensor_model_parallel_world_size", "get_local_rank", "local_device",
    "tensor_model_parallel_all_reduce", "tensor_model_parallel_all_gather", "broadcast_objects",
    "all_reduce_min", "free_port", "default_init_method",
]
