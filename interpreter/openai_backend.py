"""``sgl.OpenAI``: run programs on any OpenAI-compatible endpoint with the official ``openai`` client.

Works with OpenAI itself and with servers that speak its API (radixlm's own ``/v1``, vLLM, SGLang).
As in SGLang: a chat model (default) gets the conversation as ``messages``, so a ``gen`` must come
right after ``assistant_begin`` (or use ``@function(num_api_spec_tokens=N)``); a completion model
(``is_chat_model=False``) gets the program's text rendered with ``chat_template``.

* ``gen``: ``max_tokens``, ``stop``, ``temperature``, ``top_p``, penalties, ``n``, ``seed``;
  ``json_schema`` goes as ``response_format``; ``regex``/``dtype``/``ebnf``/``top_k``/``min_p``/
  ``ignore_eos``/``min_tokens`` go in ``extra_body`` (SGLang-style servers such as radixlm accept
  them; OpenAI itself rejects them).
* ``select``: completion models only; each choice is scored from prompt logprobs
  (``echo=True, logprobs=0, max_tokens=0``), then the choice method decides.  Raises
  NotImplementedError for chat models and RuntimeError where the endpoint returns no logprobs.
* ``fork``: children are independent states; the prefix commit is a no-op (no shared cache).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from radixlm.interpreter.backend import Backend, Response
from radixlm.interpreter.openai_spec import (
    MAX_TRIES, SpecTerm, SpecTurn, match_turn, take_speculated,
)
from radixlm.lang.chat_template import ChatTemplate, default_chat_template, named_chat_template
from radixlm.lang.choices import ChoicesDecision, ChoicesSamplingMethod
from radixlm.lang.ir import Constant, Expr, Gen, RoleEnd, SamplingParams, Select

# NOTE: as SGLang: these names default to the completions API, every other model to chat.
INSTRUCT_MODEL_NAMES = ["gpt-3.5-turbo-instruct"]
_EXTRA = {"top_k": -1, "min_p": 0.0, "min_new_tokens": None, "ignore_eos": False,
          "stop_token_ids": None, "regex": None, "ebnf": None, "repetition_penalty": None}
_EXTRA_NAMES = {"min_new_tokens": "min_tokens"}


@dataclass
class TokenUsage:
    """Tokens used so far, summed over calls (``prompt_tokens``, ``completion_tokens``)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def reset(self) -> None:
        self.prompt_tokens = self.completion_tokens = 0


class OpenAI(Backend):
    """Backend over an OpenAI-compatible HTTP API.

    Args:
        model_name: the ``model`` of every call (e.g. ``"gpt-4o-mini"``, or the served path).
        is_chat_model: use ``chat.completions``; False: ``completions``; default: chat unless
            the name is in ``INSTRUCT_MODEL_NAMES`` (``gpt-3.5-turbo-instruct``).
        chat_template: ChatTemplate or one of SGLang's names (``"chatml"``, ``"llama-3-instruct"``,
            ``"default"``, ...: ``named_chat_template``) used to render the state's
            text (and the prompt of completion models); default: the plain default template.
        is_azure: use ``openai.AzureOpenAI``.
        *args, **kwargs: passed to the ``openai`` client (``base_url``, ``api_key``, ...).
    Raises:
        ImportError: the ``openai`` package is missing.
    """

    def __init__(self, model_name: str, is_chat_model: bool | None = None,
                 chat_template: ChatTemplate | str | None = None, is_azure: bool = False,
                 *args: Any, **kwargs: Any) -> None:
        import openai

        self._openai = openai
        self.client = (openai.AzureOpenAI if is_azure else openai.OpenAI)(*args, **kwargs)
        self.model_name = model_name
        self.is_chat_model = (model_name not in INSTRUCT_MODEL_NAMES if is_chat_model is None
                              else bool(is_chat_model))
        if isinstance(chat_template, str):
            chat_template = named_chat_template(chat_template)
        self.chat_template = chat_template or default_chat_template()
        self.chat_prefix = self.chat_template.begin("assistant")
        self.token_usage = TokenUsage()
        self.spec_max_num_tries = MAX_TRIES

    # ---- Backend interface ------------------------------------------------------------------------

    def request(self, payload: dict[str, Any]) -> Response | list[Response]:
        raise NotImplementedError("sgl.OpenAI does not speak the native /generate protocol")

    def request_stream(self, payload: dict[str, Any]):
        raise NotImplementedError("sgl.OpenAI does not speak the native /generate protocol")

    def flush_cache(self, empty_cache: bool = True) -> None:
        """No-op: an API endpoint has no prefix cache to flush from here."""

    def get_server_info(self) -> dict[str, Any]:
        return {"model_name": self.model_name, "base_url": str(self.client.base_url),
                "is_chat_model": self.is_chat_model}

    def get_model_name(self) -> str:
        return self.model_name

    def commit_prefix(self, prompt: str) -> Response:
        return {}  # NOTE: nothing to commit on an API endpoint (SGLang: a no-op too).

    # ---- node execution (called by the executor for every node) ----------------------------------

    def execute_node(self, ex: Any, node: Expr) -> bool:
        """Handle ``node`` for executor ``ex``; False lets the executor run it as usual."""
        spec = ex.num_api_spec_tokens is not None
        if spec and ex.stream and isinstance(node, Gen):
            raise RuntimeError("stream is not supported with API speculative execution "
                               "(num_api_spec_tokens)")
        if spec and self.is_chat_model and ex.cur_role == "assistant":
            turn = ex.__dict__.setdefault("spec_turn", SpecTurn())
            if isinstance(node, Constant):
                turn.terms.append(SpecTerm(node.value))
                return True
            if isinstance(node, Gen):
                self._record_spec_gen(ex, turn, node)
                return True
            if isinstance(node, RoleEnd):
                self._finish_spec_turn(ex, turn)
                ex.spec_turn = SpecTurn()
                return False
        if isinstance(node, Constant) and spec and not self.is_chat_model:
            value = node.value
            ex.speculated_text = (ex.speculated_text[len(value):]
                                  if ex.speculated_text.startswith(value) else "")
            return False
        if isinstance(node, Gen):
            self._gen(ex, node, node.params.merged(ex.defaults))
            return True
        return False

    # ---- generation --------------------------------------------------------------------------------

    def _kwargs(self, params: SamplingParams) -> dict[str, Any]:
        native = params.to_native()
        kw: dict[str, Any] = {"max_tokens": native.get("max_new_tokens")}
        for key in ("temperature", "top_p", "frequency_penalty", "presence_penalty", "seed", "logit_bias"):
            if native.get(key) is not None:
                kw[key] = native[key]
        if native.get("stop"):
            kw["stop"] = native["stop"]
        if params.n not in (None, 1):
            kw["n"] = int(params.n)
        extra = {_EXTRA_NAMES.get(k, k): native[k] for k, default in _EXTRA.items()
                 if native.get(k) is not None and native.get(k) != default}
        if extra:
            kw["extra_body"] = extra
        if native.get("json_schema") is not None:
            fmt = {"type": "json_schema", "json_schema": {
                "name": "output", "schema": json.loads(native["json_schema"])}}
            if self.is_chat_model:
                kw["response_format"] = fmt
            else:  # NOTE: not an OpenAI completions field; SGLang-style servers accept it.
                kw.setdefault("extra_body", {})["response_format"] = fmt
        return kw

    def _prompt(self, ex: Any) -> Any:
        if not self.is_chat_model:
            return ex.text_
        if ex.cur_role != "assistant" or not ex.text_.endswith(self.chat_prefix):
            raise RuntimeError(
                "For OpenAI chat models, sgl.gen must be right after sgl.assistant (or use "
                "@function(num_api_spec_tokens=N) for API speculative execution)")
        return [dict(m) for m in ex.messages_]

    def _call(self, prompt: Any, kw: dict[str, Any]) -> Any:
        if self.is_chat_model:
            ret = self.client.chat.completions.create(model=self.model_name, messages=prompt, **kw)
        else:
            ret = self.client.completions.create(model=self.model_name, prompt=prompt, **kw)
        if ret.usage is not None:
            self.token_usage.prompt_tokens += ret.usage.prompt_tokens
            self.token_usage.completion_tokens += ret.usage.completion_tokens
        return ret

    def _texts(self, ret: Any) -> list[str]:
        if self.is_chat_model:
            return [c.message.content or "" for c in ret.choices]
        return [c.text for c in ret.choices]

    @staticmethod
    def _meta(ret: Any, index: int = 0) -> dict[str, Any]:
        choice = ret.choices[index]
        meta: dict[str, Any] = {"id": ret.id, "finish_reason": choice.finish_reason}
        if ret.usage is not None:
            meta["prompt_tokens"] = ret.usage.prompt_tokens
            meta["completion_tokens"] = ret.usage.completion_tokens
        if getattr(choice, "logprobs", None) is not None:
            meta["logprobs"] = choice.logprobs.model_dump()
        return meta

    def _gen(self, ex: Any, node: Gen, params: SamplingParams) -> None:
        if ex.num_api_spec_tokens is not None and not self.is_chat_model and not ex.stream:
            return self._spec_completion_gen(ex, node, params)
        kw = self._kwargs(params)
        if params.return_logprob:
            kw["logprobs"] = True if self.is_chat_model else int(params.top_logprobs_num or 0)
            if self.is_chat_model and params.top_logprobs_num:
                kw["top_logprobs"] = int(params.top_logprobs_num)
        prompt = self._prompt(ex)
        if ex.stream and "n" not in kw:
            return self._gen_stream(ex, node, prompt, kw)
        ret = self._call(prompt, kw)
        texts = self._texts(ret)
        ex._append(texts[0], node.name)
        if node.name is not None:
            if len(texts) > 1:
                ex.set_var(node.name, texts, [self._meta(ret, i) for i in range(len(texts))])
            else:
                ex.set_var(node.name, texts[0], self._meta(ret))

    def _gen_stream(self, ex: Any, node: Gen, prompt: Any, kw: dict[str, Any]) -> None:
        create = self.client.chat.completions.create if self.is_chat_model else \
            self.client.completions.create
        key = "messages" if self.is_chat_model else "prompt"
        parts: list[str] = []
        finish = None
        for chunk in create(model=self.model_name, stream=True, **{key: prompt}, **kw):
            if not chunk.choices:
                continue
            c = chunk.choices[0]
            delta = (c.delta.content if self.is_chat_model else c.text) or ""
            finish = c.finish_reason or finish
            parts.append(delta)
            ex._append(delta, node.name)
        if node.name is not None:
            ex.set_var(node.name, "".join(parts), {"finish_reason": finish})

    # ---- API speculative execution (see openai_spec.py) -----------------------------------------

    def _record_spec_gen(self, ex: Any, turn: SpecTurn, node: Gen) -> None:
        params = node.params.merged(ex.defaults)
        kw = self._kwargs(params)
        kw.pop("stop", None)
        kw["max_tokens"] = ex.num_api_spec_tokens
        for key, value in kw.items():
            if turn.kwargs.setdefault(key, value) != value:
                raise ValueError(f"API speculative execution needs the same {key} for every gen "
                                 f"of a turn ({turn.kwargs[key]!r} != {value!r})")
        turn.terms.append(SpecTerm("", params.to_native().get("stop"), node.name))

    def _finish_spec_turn(self, ex: Any, turn: SpecTurn) -> None:
        if any(t.name is not None for t in turn.terms) and ex.text_.endswith(self.chat_prefix):
            for _ in range(self.spec_max_num_tries):
                comp = self._texts(self._call([dict(m) for m in ex.messages_], turn.kwargs))[0]
                if match_turn(turn.terms, comp):
                    break
        for term in turn.terms:
            ex._append(term.text, term.name)
            if term.name is not None:
                ex.set_var(term.name, term.text, {})

    def _spec_completion_gen(self, ex: Any, node: Gen, params: SamplingParams) -> None:
        max_new = int(params.max_new_tokens or 128)
        stop = params.to_native().get("stop")
        if not ex.speculated_text or (not stop and len(ex.speculated_text) < max_new):
            kw = self._kwargs(params)
            kw.pop("stop", None)
            kw["max_tokens"] = max(max_new, ex.num_api_spec_tokens)
            ex.speculated_text = self._texts(self._call(ex.text_, kw))[0]
        value, ex.speculated_text = take_speculated(ex.speculated_text, stop, max_new)
        ex._append(value, node.name)
        if node.name is not None:
            ex.set_var(node.name, value, {})

    # ---- select ----------------------------------------------------------------------------------

    def select(self, prompt: str, choices: list[str],
               method: ChoicesSamplingMethod) -> ChoicesDecision:
        """Score ``choices`` from echoed prompt logprobs (completion models only).

        Raises:
            NotImplementedError: a chat model. RuntimeError: the endpoint returned no logprobs.
        """
        if self.is_chat_model:
            raise NotImplementedError(
                "select/choices is not supported for OpenAI chat models (no prompt logprobs); "
                "use a completion model: sgl.OpenAI(model, is_chat_model=False, ...)")
        cond = self._choice_entries(prompt, choices)
        uncond = None
        if method.requires_unconditional_logprobs:
            uncond = self._choice_entries("", choices, keep_first=True)
            if any(len(a) != len(b) for a, b in zip(cond, uncond)):
                raise RuntimeError("unconditional_likelihood_normalized: the choices tokenize "
                                   "differently alone and after the prompt")
        normalized = [sum(e[0] for e in row) / len(row) if row else 0.0 for row in cond]
        return method(choices=choices, normalized_prompt_logprobs=normalized,
                      input_token_logprobs=cond, output_token_logprobs=[[] for _ in choices],
                      unconditional_token_logprobs=uncond)

    def _choice_entries(self, prompt: str, choices: list[str],
                        keep_first: bool = False) -> list[list[list[Any]]]:
        """Per choice, ``[logprob, None, token]`` of the tokens reaching past ``prompt`` (one
        batched call)."""
        try:
            ret = self._call([prompt + c for c in choices],
                             {"max_tokens": 0, "echo": True, "logprobs": 0, "temperature": 0})
        except self._openai.BadRequestError as exc:
            raise RuntimeError(f"select needs prompt logprobs (echo + logprobs): {exc}") from exc
        rows: list[list[list[Any]]] = [[] for _ in choices]
        for c in ret.choices:
            lp = c.logprobs
            if lp is None or not lp.tokens or lp.token_logprobs is None:
                raise RuntimeError("select needs an endpoint that returns prompt logprobs "
                                   "(completions with echo=True, logprobs=0)")
            offsets = lp.text_offset or []
            for i, (tok, val) in enumerate(zip(lp.tokens, lp.token_logprobs)):
                end = (offsets[i] if i < len(offsets) else 0) + len(tok)
                if end > len(prompt) and (val is not None or keep_first):
                    rows[c.index].append([val, None, tok])
        return rows
