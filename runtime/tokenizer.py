"""Tokenizer loading and the shaping of SGLang-native outputs from finished/streaming requests."""

from __future__ import annotations

import json
import os
import time

from radixlm.runtime.request import Req


def load_tokenizer(tokenizer_path: str, model_path: str, skip: bool = False):
    """Load the HF tokenizer (``None`` when ``skip``) and gather EOS ids from the tokenizer,
    ``config.json`` and ``generation_config.json``. Returns ``(tokenizer, eos_token_ids)``."""
    from transformers import AutoTokenizer

    tok = None if skip else AutoTokenizer.from_pretrained(tokenizer_path)
    eos: list[int] = []
    for name in ("config.json", "generation_config.json"):
        path = os.path.join(model_path, name)
        if os.path.exists(path):
            with open(path) as f:
                value = json.load(f).get("eos_token_id")
            eos.extend(value if isinstance(value, list) else ([] if value is None else [value]))
    if tok is not None and tok.eos_token_id is not None:
        eos.append(tok.eos_token_id)
    return tok, sorted(set(eos))


def _entries(tokenizer, items, with_text: bool) -> tuple[list, list]:
    """(logprob, id, top) tuples -> ([lp, id, text], top lists of [lp, id, text])."""
    text = (lambda i: tokenizer.decode([i])) if with_text and tokenizer is not None else (lambda i: None)
    main, tops = [], []
    for lp, tid, top in items:
        main.append([lp, tid, text(tid)])
        tops.append(None if top is None else [[v, t, text(t)] for v, t in top])
    return main, tops


def make_output(req: Req, tokenizer, return_text_in_logprobs: bool = False) -> dict:
    """The native ``/generate`` response for ``req`` (cumulative while streaming)."""
    detok = req.detok
    meta = {
        "id": req.rid,
        "finish_reason": req.finish_reason,
        "prompt_tokens": len(req.origin_input_ids),
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "e2e_latency": time.perf_counter() - (req.t0 or time.perf_counter()),
    }
    if req.spec_verify_ct:  # speculative decoding: verify steps with a draft, draft acceptance
        from radixlm.runtime.speculative_worker import spec_meta_info

        meta.update(spec_meta_info(req))
    if req.return_logprob:
        inp, inp_top = _entries(tokenizer, req.input_logprobs, return_text_in_logprobs)
        out, out_top = _entries(tokenizer, req.output_logprobs, return_text_in_logprobs)
        meta.update(input_token_logprobs=inp, output_token_logprobs=out)
        if req.top_logprobs_num:
            meta.update(input_top_logprobs=inp_top, output_top_logprobs=out_top)
    return {"text": detok.text if detok is not None else "", "output_ids": list(req.output_ids), "meta_info": meta}


def encode_batch(tokenizer, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
    """Token ids of each text, as ``tokenizer.encode(text, add_special_tokens=...)`` gives them,
    in one call: a fast (Rust) HF tokenizer encodes the batch in parallel, outside the GIL. Raises
    what the tokenizer raises (``TypeError``/``ValueError`` for text it refuses)."""
    if len(texts) == 1 or not callable(tokenizer):
        return [tokenizer.encode(t, add_special_tokens=add_special_tokens) for t in texts]
    return [list(ids) for ids in tokenizer(list(texts), add_special_tokens=add_special_tokens)["input_ids"]]
