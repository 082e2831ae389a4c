"""Entry points behind ``Function.run``, ``run_batch`` and ``cache``."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from radixlm.interpreter.backend import Backend, resolve_backend
from radixlm.interpreter.executor import StreamExecutor
from radixlm.interpreter.state import ProgramState
from radixlm.lang.global_config import global_config
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
    if global_config.verbosity >= 2:
        print(state.text())


def run_program(func: Function, backend: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                defaults: SamplingParams, stream: bool, use_thread: bool = True) -> ProgramState:
    """Start one program; see ``Function.run``. Argument errors raise TypeError here."""
    be = resolve_backend(backend)
    arguments = func.bind_call(args, kwargs)
    state = ProgramState(StreamExecutor(be, defaults, stream=stream,
                                        num_api_spec_tokens=func.num_api_spec_tokens))
    state.executor.inline = not use_thread
    if stream:
        state.executor.owner = -1  # NOTE: body not started yet; other threads must wait for it.
        threading.Thread(target=_run_body, args=(func, state, arguments), daemon=True,
                         name="radixlm-program").start()
    else:
        _run_body(func, state, arguments)
    return state


def cache_program(func: Function, backend: Any = None) -> str:
    """Commit the program's traced constant prefix (one prefill-only request); returns it.

    As in SGLang, nothing is sent when the prefix has 64 characters or fewer.
    """
    be: Backend = resolve_backend(backend)
    prefix = func.trace().constant_prefix(be.chat_template)
    if len(prefix) > 64:
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
                      num_threads: int | str, progress_bar: bool,
                      generator_style: bool = False) -> list[ProgramState] | Iterator[ProgramState]:
    """Run ``func`` on every argument set; see ``Function.run_batch``."""
    if not batch:
        return iter(()) if generator_style else []
    be = resolve_backend(backend)
    kwargs_list = [_as_kwargs(func, item) for item in batch]
    for i, kw in enumerate(kwargs_list):
        try:
            func.bind_call((), kw)  # NOTE: fail fast on bad arguments, before any request is sent.
        except TypeError as exc:
            raise TypeError(f"run_batch item {i}: {exc}") from None
    if global_config.enable_precache_with_tracing and len(batch) > 1:
        cache_program(func, be)
    workers = min(len(batch), 64) if num_threads == "auto" else max(1, int(num_threads))

    def one(kw: dict[str, Any]) -> ProgramState:
        st = run_program(func, be, (), kw, defaults, stream=False)
        st.sync()
        return st

    if generator_style:
        return _generate_states(one, kwargs_list, workers, progress_bar)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="radixlm-batch") as pool:
        futures = [pool.submit(one, kw) for kw in kwargs_list]
        if progress_bar:
            from concurrent.futures import as_completed

            from tqdm import tqdm

            for _ in tqdm(as_completed(futures), total=len(futures)):
                pass
        return [f.result() for f in futures]


def _generate_states(one: Any, kwargs_list: list[dict[str, Any]], workers: int,
                     progress_bar: bool) -> Iterator[ProgramState]:
    """Yield finished states in input order, submitting at most ``4 * workers`` ahead."""
    from collections import deque

    bar = None
    if progress_bar:
        from tqdm import tqdm

        bar = tqdm(total=len(kwargs_list))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="radixlm-batch") as pool:
        pending: deque[Any] = deque()
        items = iter(kwargs_list)
        for kw in items:
            pending.append(pool.submit(one, kw))
            if len(pending) >= 4 * workers:
                break
        while pending:
            state = pending.popleft().result()
            nxt = next(items, None)
            if nxt is not None:
                pending.append(pool.submit(one, nxt))
            if bar is not None:
                bar.update()
            yield state
    if bar is not None:
        bar.close()
