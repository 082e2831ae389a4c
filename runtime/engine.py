"""``radixlm.Engine``: the in-process runtime (no HTTP). A background thread runs the same
scheduler and the same loop (``runtime/scheduler_loop.py``) the server uses; ``generate``
tokenizes, builds the requests (``runtime/request.py`` ``build_req``), submits, and shapes
SGLang-native results."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import uuid
from typing import Any, Iterator

from radixlm.runtime.request import Req, build_req, sample_rids
from radixlm.runtime.sampling_params import SamplingParams
from radixlm.runtime.scheduler import Scheduler
from radixlm.runtime.scheduler_loop import run_scheduler_loop
from radixlm.runtime.warmup import warm_up
from radixlm.runtime.server_args import ServerArgs
from radixlm.runtime.tokenizer import encode_batch, load_tokenizer, make_output

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5  # the scheduler thread's longest wait for input when idle


def _deliver(reqs: list[Req]) -> None:
    for req in reqs:
        req.sink(req)


class Engine:
    """Offline engine over one model.

    Args:
        model_path: HF model folder or ``.gguf`` file; ``None`` uses the default model,
            SmolLM2-135M-Instruct (converted on first use under ``$RADIXLM_CACHE``, default
            ``~/.cache/radixlm``; see :mod:`radixlm.runtime.default_model`).
        **server_args: any :class:`ServerArgs` field (``dtype``, ``device``, ``max_total_tokens``,
            ``chunked_prefill_size``, ``schedule_policy``, ``disable_radix_cache``, ...).
    Raises ``TypeError`` for unknown server args and ``ValueError`` for invalid values.

    Thread-safe: ``generate`` may be called from several threads at once. Use as a context
    manager or call :meth:`shutdown`.
    """

    def __init__(self, model_path: str | None = None, **server_args: Any) -> None:
        from radixlm.runtime.model_runner import ModelRunner
        from radixlm.runtime.default_model import resolve_model_path

        model_path = resolve_model_path(model_path or server_args.pop("model_path", None))
        server_args["model_path"] = model_path
        self.server_args = ServerArgs.from_kwargs(**server_args)
        tok_path = self.server_args.tokenizer_path or model_path
        self.tokenizer, eos_ids = load_tokenizer(tok_path, model_path, self.server_args.skip_tokenizer_init)
        self._tp = None  # TPLeader under tensor parallelism (runtime/tp_worker.py)
        self._tp_procs: list = []
        if self.server_args.tp_size > 1:
            from radixlm.runtime.tp_worker import TPLeader, start_engine_ranks

            self._tp_procs = start_engine_ranks(self.server_args)  # NOTE: this thread is rank 0
        try:
            self.runner = ModelRunner(self.server_args, model_path, eos_ids)
            self.scheduler = Scheduler.create(self.server_args, self.runner, self.tokenizer)
            warm_up(self.scheduler)
        except BaseException:
            if self._tp_procs:  # NOTE: the followers fail alike (same config); leave the group
                from radixlm.runtime.tp_worker import stop_engine_followers

                stop_engine_followers(self._tp_procs, timeout_s=5)
            raise
        if self._tp_procs:
            self._tp = TPLeader(self.scheduler)
        self._inbox: queue.Queue = queue.Queue()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="radixlm-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Stop the scheduler thread; pending requests finish with an abort reason."""
        if not self._stopped.is_set():
            self._stopped.set()
            self._inbox.put(("wake", None))
            self._thread.join(timeout=30)
            self.scheduler.grammar.shutdown()
            self.runner.release()
            if self._tp_procs:
                from radixlm.runtime.tp_worker import stop_engine_followers

                stop_engine_followers(self._tp_procs)

    # ------------------------------------------------------ scheduler thread
    def _loop(self) -> None:
        """The scheduler thread: the shared loop (runtime/scheduler_loop.py) over the inbox."""
        run_scheduler_loop(self.scheduler, self._receive, _deliver, idle_wait_s=IDLE_WAIT_S,
                           should_stop=self._stopped.is_set, sync=self._sync if self._tp is not None else None)
        _deliver(self.scheduler.abort_all("engine shut down"))
        if self._tp is not None:
            self._tp.stop()

    def _sync(self) -> bool:
        if self._tp.sync():
            return True
        self._stopped.set()  # NOTE: a TP rank is gone
        return False

    def _receive(self, wait_s: float) -> list[Req]:
        """Apply the inbox items (waiting up to ``wait_s`` for the first); returns the requests
        that finished here (rejected on arrival, aborted)."""
        finished: list[Req] = []
        try:
            item = self._inbox.get(timeout=wait_s) if wait_s > 0 else self._inbox.get_nowait()
            while True:
                self._handle(*item, finished)
                item = self._inbox.get_nowait()
        except queue.Empty:
            pass
        return finished

    def _handle(self, kind: str, payload: Any, finished: list[Req]) -> None:
        if self._tp is not None:
            self._tp.record(kind, payload)
        if kind == "add":
            req = payload
            try:
                self.scheduler.add_request(req)
            except Exception as e:  # NOTE: as the server's scheduler process: a 400 for the caller
                req.finish_reason = {"type": "abort", "message": f"{type(e).__name__}: {e}", "status_code": 400}
                finished.append(req)
        elif kind == "abort":
            req = self.scheduler.abort(payload)
            if req is not None:
                finished.append(req)
        elif kind == "call":
            fn, box = payload
            try:
                box.put((True, fn()))
            except Exception as e:
                box.put((False, e))

    def _call(self, fn):
        """Run ``fn`` on the scheduler thread and return its result."""
        box: queue.Queue = queue.Queue()
        self._inbox.put(("call", (fn, box)))
        ok, value = box.get()
        if not ok:
            raise value
        return value

    # ------------------------------------------------------------- requests
    def _make_reqs(self, prompt, sampling_params, input_ids, return_logprob, logprob_start_len, top_logprobs_num, rid,
                   cache_lease=None):
        if (prompt is None) == (input_ids is None):
            raise ValueError("pass exactly one of prompt and input_ids")
        single = isinstance(prompt, str) if prompt is not None else not (input_ids and isinstance(input_ids[0], list))
        prompts = ([prompt] if single else list(prompt)) if prompt is not None else None
        ids_list = ([input_ids] if single else list(input_ids)) if input_ids is not None else None
        count = len(prompts) if prompts is not None else len(ids_list)
        sps = sampling_params if isinstance(sampling_params, list) else [sampling_params] * count
        if len(sps) != count:
            raise ValueError(f"got {len(sps)} sampling_params for {count} prompts")
        sps = [SamplingParams.from_dict(x) for x in sps]  # NOTE: a SamplingParams (the DSL's) is taken as is
        if ids_list is None and self.tokenizer is None:
            raise ValueError("this engine has no tokenizer (skip_tokenizer_init): pass input_ids")
        if ids_list is None:
            ids_list = encode_batch(self.tokenizer, prompts)
        groups = []
        for i, sp in enumerate(sps):
            base = (rid[i] if isinstance(rid, list) else rid) if rid is not None else uuid.uuid4().hex
            groups.append([build_req(r, ids_list[i], sp, sample=k, return_logprob=return_logprob,
                                     logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
                                     cache_lease=cache_lease, device=self.runner.device)
                           for k, r in enumerate(sample_rids(base, sp.n))])
        return single, groups

    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | SamplingParams | list[dict | SamplingParams] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool = False,
        logprob_start_len: int | None = None,
        top_logprobs_num: int | None = None,
        stream: bool = False,
        rid: str | list[str] | None = None,
        return_text_in_logprobs: bool = False,
        cache_lease: dict | None = None,
    ) -> dict | list | Iterator[dict]:
        """Generate for one prompt (str / list of ids) or a batch (list of str / list of lists).

        Returns SGLang-native results ``{"text", "output_ids", "meta_info"}``: a dict for one
        prompt with ``n == 1``, otherwise a list (prompt-major, then the ``n`` samples). With
        ``stream=True`` returns an iterator of chunks with the cumulative ``text`` (one prompt only).
        ``sampling_params``: a protocol dict (validated here) or a ``SamplingParams`` (already
        validated, e.g. by the DSL: used as is), or one per prompt.
        ``cache_lease`` ``{"id": str, "ttl_s": float}``: lease the cached sequence when the request
        finishes (docs/server.md; :meth:`release_cache_lease`).
        Raises ``ValueError`` for invalid arguments or sampling params.
        """
        single, groups = self._make_reqs(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                         top_logprobs_num, rid, cache_lease)
        reqs = [r for g in groups for r in g]
        if stream:
            if len(reqs) != 1:
                raise ValueError("stream=True takes one prompt with n=1")
            return self._stream(reqs[0], return_text_in_logprobs)
        self._run_to_end(reqs)
        outs = [make_output(r, self.tokenizer, return_text_in_logprobs) for r in reqs]
        return outs[0] if single and len(outs) == 1 else outs

    def _run_to_end(self, reqs: list[Req]) -> None:
        """Queue ``reqs`` on the scheduler thread and block until every one has finished."""
        done: queue.Queue = queue.Queue()
        for r in reqs:
            r.sink = lambda req: done.put(req) if req.finished else None
            self._inbox.put(("add", r))
        for _ in reqs:
            done.get()

    def _stream(self, req: Req, text_in_logprobs: bool) -> Iterator[dict]:
        q: queue.Queue = queue.Queue()
        req.sink = lambda r: q.put(make_output(r, self.tokenizer, text_in_logprobs))
        self._inbox.put(("add", req))
        while True:
            chunk = q.get()
            yield chunk
            if chunk["meta_info"]["finish_reason"] is not None:
                return

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                             logprob_start_len=None, top_logprobs_num=None, stream=False, rid=None,
                             return_text_in_logprobs=False, cache_lease=None):
        """Async :meth:`generate`: awaits the result, or with ``stream=True`` returns an async
        iterator of chunks."""
        loop = asyncio.get_running_loop()
        single, groups = self._make_reqs(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                         top_logprobs_num, rid, cache_lease)
        reqs = [r for g in groups for r in g]
        if stream:
            if len(reqs) != 1:
                raise ValueError("stream=True takes one prompt with n=1")
            return self._astream(reqs[0], return_text_in_logprobs, loop)
        futures = []
        for r in reqs:
            fut = loop.create_future()
            r.sink = lambda req, fut=fut: (
                loop.call_soon_threadsafe(lambda: fut.done() or fut.set_result(req)) if req.finished else None
            )
            futures.append(fut)
            self._inbox.put(("add", r))
        done = await asyncio.gather(*futures)
        outs = [make_output(r, self.tokenizer, return_text_in_logprobs) for r in done]
        return outs[0] if single and len(outs) == 1 else outs

    async def _astream(self, req: Req, text_in_logprobs: bool, loop):
        q: asyncio.Queue = asyncio.Queue()
        req.sink = lambda r: loop.call_soon_threadsafe(q.put_nowait, make_output(r, self.tokenizer, text_in_logprobs))
        self._inbox.put(("add", req))
        while True:
            chunk = await q.get()
            yield chunk
            if chunk["meta_info"]["finish_reason"] is not None:
                return

    def score_choices(self, prompt: str, choices: list[str], choices_method: str = "token_length_normalized",
                      cache_lease: dict | None = None, rid: str | None = None) -> dict:
        """``select`` in one submission: scores every ``prompt + choice`` (and, for
        ``unconditional_likelihood_normalized``, the choices alone) in one prefill round.

        Returns the native response of ``/generate`` with ``choices`` (docs/server.md): ``text``
        is the decision, ``meta_info`` holds the per-choice scores. Raises ``ValueError`` for
        bad arguments or when a scoring request is refused.
        """
        from radixlm.runtime.choices import SCORING_PARAMS, ChoicesPlan

        if self.tokenizer is None:
            raise ValueError("score_choices needs a tokenizer (skip_tokenizer_init is set)")
        t0 = time.perf_counter()
        plan = ChoicesPlan.build(self.tokenizer.encode, lambda t: self.tokenizer.decode([t]), prompt, choices,
                                 choices_method)
        base = rid or uuid.uuid4().hex
        reqs = [r for i, (ids, start) in enumerate(plan.requests())
                for r in self._make_reqs(None, SCORING_PARAMS, ids, True, start, 0, f"{base}-choice-{i}",
                                         cache_lease if i < len(choices) else None)[1][0]]
        self._run_to_end(reqs)
        bad = next((r.finish_reason for r in reqs if r.finish_reason.get("type") == "abort"), None)
        if bad is not None:
            raise ValueError(f"choice scoring refused: {bad.get('message')}")
        outs = [make_output(r, self.tokenizer, True)["meta_info"] for r in reqs]
        cached = sum(m["cached_tokens"] for m in outs[: len(choices)])
        return plan.response([m["input_token_logprobs"] for m in outs], cached, base, t0, outs[0]["finish_reason"])

    def release_cache_lease(self, ids: str | list[str], wait: bool = True) -> int | None:
        """End program leases (``cache_lease`` ids); unknown ids are ignored. Returns how many
        ended (``None`` with ``wait=False``: queued for the scheduler thread; 0 after shutdown)."""
        ids = [ids] if isinstance(ids, str) else list(ids)
        if self._stopped.is_set():
            return 0
        fn = lambda: self.scheduler.tree_cache.release_leases(ids)  # noqa: E731
        if not wait:
            self._inbox.put(("call", (fn, queue.Queue())))
            return None
        return self._call(fn)

    # ---------------------------------------------------------------- admin
    def abort(self, rid: str) -> None:
        """Abort a queued or running request; it finishes with reason ``abort``."""
        self._inbox.put(("abort", rid))

    def flush_cache(self) -> bool:
        """Empty the prefix cache. Returns False (and does nothing) while requests are in flight."""
        return self._call(self.scheduler.flush_cache)

    def get_server_info(self) -> dict:
        """Server args plus live counters (cache hit rate, token counts, pool usage)."""
        def info():
            return {**vars(self.server_args), **self.scheduler.server_info()}
        return self._call(info)

    @property
    def cache_hit_rate(self) -> float:
        return self.scheduler.stats.cache_hit_rate
