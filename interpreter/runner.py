"""Entry points behind ``Function.run``, ``run_batch`` and ``cache``."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from radixlm.interpreter.backend import Backend, resolve_backend
from radixlm.interpreter.executor import StreamExecutor
from radixlm.interpreter.state import ProgramState
from radixlm.lang.ir import SamplingParams

if TYPE_CHECKING:
    from radixlm.lang.function import Function

logger = logging.getLogger(__name__)


def _run_body(func: Function, state: ProgramState, arguments: dict[str, Any]) -> None:
    state.executor.owner = threading.get_ident()
    try:
        state.ret_value = func.func(state, **arguments)
    except Exception as exc:  # noqa: BLE001 - reported through state.error(), never hangs
        logger.warning("program %s raised %r", func.__name__, exc, exc_info=True)
        state.executor.set_error(exc)
    finally:
        state.executor.end()


def run_program(func: Function, backend: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                defaults: SamplingParams, stream: bool) -> ProgramState:
    """Start one program; see ``Function.run``. Argument errors raise TypeError here."""
    be = resolve_backend(backend)
    arguments = func.bind_call(args, kwargs)
    state = ProgramState(StreamExecutor(be, defaults, stream=stream))
    if stream:
        state.executor.owner = -1  # NOTE: body not started yet; other threads must wait for it.
        threading.Thread(target=_run_body, args=(func, state, arguments), daemon=True,
                         name="radixlm-program").start()
    else:
        _run_body(func, state, arguments)
    return state


def cache_program(func: Function, backend: Any = None) -> str:
    """Commit the program's traced constant prefix (one prefill-only request); returns it.

    Nothing is sent when the prefix is empty.
    """
    be: Backend = resolve_backend(backend)
    prefix = func.trace().constant_prefix(be.chat_template)
    if prefix:
        be.commit_prefix(prefix)
    return prefix


def _as_kwargs(func: Function, item: Any) -> dict[str, Any]:
    if isinstance(item, dict):
        return item
    if isinstance(item, (list, tuple)):
        if len(item) > len(func.arg_names):
            raise TypeError(f"{func.__name__}() takes {len(func.arg_names)} arguments, "
                            f"got {len(item)}")
        return dict(zip(func.arg_names, item))
    raise TypeError(f"run_batch items must be dicts or tuples, got {type(item).__name__}")


def run_program_batch(func: Function, backend: Any, batch: list[Any], defaults: SamplingParams,
                      num_threads: int | str, progress_bar: bool) -> list[ProgramState]:
    """Run ``func`` on every argument set; see ``Function.run_batch``."""
    if not batch:
        return []
    be = resolve_backend(backend)
    kwargs_list = [_as_kwargs(func, item) for item in batch]
    for kw in kwargs_list:
        func.bind_call((), kw)  # NOTE: fail fast on bad arguments, before any request is sent.
    if len(batch) > 1:
        cache_program(func, be)
    workers = min(len(batch), 64) if num_threads == "auto" else max(1, int(num_threads))

    def one(kw: dict[str, Any]) -> ProgramState:
        st = run_program(func, be, (), kw, defaults, stream=False)
        st.sync()
        return st

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="radixlm-batch") as pool:
        futures = [pool.submit(one, kw) for kw in kwargs_list]
        if progress_bar:
            from concurrent.futures import as_completed

            from tqdm import tqdm

            for _ in tqdm(as_completed(futures), total=len(futures)):
                pass
        return [f.result() for f in futures]
