"""The prefix cache inside the engine: same outputs with the cache on and off, exact
``cached_tokens`` accounting, and no leaked KV slots (issue 3, engine level)."""

from __future__ import annotations

import random

import pytest

from radixlm.runtime.engine import Engine

GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}


def shared_prefix_prompts(n: int = 12, prefix_len: int = 48, seed: int = 0) -> tuple[list[int], list[list[int]]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(10, 2000) for _ in range(prefix_len)]
    return prefix, [prefix + [rng.randrange(10, 2000) for _ in range(rng.randrange(1, 12))] for _ in range(n)]


@pytest.fixture(scope="module")
def reference(tiny_llama):
    _, prompts = shared_prefix_prompts()
    with Engine(tiny_llama, device="cpu", max_total_tokens=4096, disable_radix_cache=True) as e:
        return [e.generate(input_ids=p, sampling_params=GREEDY)["output_ids"] for p in prompts]


@pytest.mark.parametrize(
    "server_args",
    [
        {},
        {"chunked_prefill_size": 16},
        {"max_total_tokens": 160},  # forces retraction
        {"schedule_policy": "fcfs"},
        {"schedule_policy": "dfs-weight", "page_size": 4},
    ],
)
def test_outputs_identical_with_cache(tiny_llama, reference, server_args):
    _, prompts = shared_prefix_prompts()
    kw = {"max_total_tokens": 4096, **server_args}
    with Engine(tiny_llama, device="cpu", **kw) as e:
        outs = e.generate(input_ids=prompts, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == reference
        # Second round: every prompt is now cached except its last token.
        again = e.generate(input_ids=prompts, sampling_params=GREEDY)
        assert [o["output_ids"] for o in again] == reference
        page = kw.get("page_size", 1)
        cached = [o["meta_info"]["cached_tokens"] for o in again]
        if "max_total_tokens" in server_args:  # a small pool evicts: hits are partial
            assert 0 < sum(cached) and all(c <= len(p) - 1 for c, p in zip(cached, prompts))
        else:
            assert cached == [(len(p) - 1) // page * page for p in prompts]
        assert e.flush_cache()
        info = e.get_server_info()
        assert info["kv_available_tokens"] == info["max_total_num_tokens"]  # no leaked slots


def test_cached_tokens_equal_shared_prefix(tiny_llama):
    prefix, prompts = shared_prefix_prompts(n=3)
    with Engine(tiny_llama, device="cpu", max_total_tokens=4096) as e:
        first = e.generate(input_ids=prompts[0], sampling_params=GREEDY)
        assert first["meta_info"]["cached_tokens"] == 0
        second = e.generate(input_ids=prompts[1], sampling_params=GREEDY)
        common = 0
        while prompts[0][common] == prompts[1][common]:
            common += 1
        assert second["meta_info"]["cached_tokens"] == common >= len(prefix)
        # The previous request's output is cached too: continuing a conversation hits it all.
        follow = prompts[1] + second["output_ids"] + [42, 43]
        third = e.generate(input_ids=follow, sampling_params=GREEDY)
        assert third["meta_info"]["cached_tokens"] == len(prompts[1]) + len(second["output_ids"]) - 1
        assert e.get_server_info()["cache_hit_rate"] > 0


def test_flush_cache_refused_while_busy(tiny_llama):
    with Engine(tiny_llama, device="cpu", max_total_tokens=4096) as e:
        stream = e.generate(input_ids=list(range(10, 40)), sampling_params={**GREEDY, "max_new_tokens": 64}, stream=True)
        next(stream)
        assert e.flush_cache() is False
        list(stream)
        assert e.flush_cache() is True


@pytest.mark.parametrize("policy", ["fcfs", "lpm"])
def test_in_batch_prefix_computed_once(tiny_llama, reference, policy):
    """Requests arriving together with a shared uncached prefix: one computes it, the others wait
    a step and find it cached (in-batch prefix caching), also under fcfs (and lpm's long-queue
    fcfs fallback); outputs unchanged."""
    prefix, prompts = shared_prefix_prompts()
    with Engine(tiny_llama, device="cpu", max_total_tokens=4096, schedule_policy=policy) as e:
        outs = e.generate(input_ids=prompts, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == reference
        cached = sorted(o["meta_info"]["cached_tokens"] for o in outs)
        assert cached[0] == 0 and all(c >= len(prefix) for c in cached[1:]), cached
