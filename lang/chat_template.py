"""Chat templates as role markers: the text before and after each role's content.

The DSL writes messages incrementally (``s += user(...)`` then ``s += assistant(gen(...))``), so it
needs each role's begin/end strings rather than a whole-conversation renderer.  They are derived
from the tokenizer's own (Jinja) chat template by rendering conversations with sentinel contents and
cutting around the sentinels (the approach SGLang's ``chat_template.py`` takes by hand per model
family, here automated); a plain ``Role: text`` template is used when the tokenizer has none.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant")
_SENTINEL = {"system": "QzSYSTEMzQ", "user": "QzUSERzQ", "assistant": "QzASSISTANTzQ"}


@dataclass(frozen=True)
class ChatTemplate:
    """Begin/end markers per role.

    Attributes:
        name: ``"default"``, ``"tokenizer"`` (derived from a tokenizer's chat template) or one of
            SGLang's template names (``lang/chat_template_registry.py``).
        role_markers: role -> ``(begin, end)``; content goes between them.
        default_system_prompt: as SGLang's: when the first message of a state is not a system
            message, a system message with this text is inserted first (``None``: never).
    """

    name: str
    role_markers: dict[str, tuple[str, str]]
    default_system_prompt: str | None = None

    def begin(self, role: str) -> str:
        """Text that opens a ``role`` message. Raises KeyError for unknown roles."""
        return self.role_markers[role][0]

    def end(self, role: str) -> str:
        """Text that closes a ``role`` message. Raises KeyError for unknown roles."""
        return self.role_markers[role][1]

    def render(self, messages: list[dict[str, str]]) -> str:
        """Whole conversation as text: ``begin + content + end`` per message."""
        return "".join(self.begin(m["role"]) + m["content"] + self.end(m["role"]) for m in messages)


def default_chat_template() -> ChatTemplate:
    """The plain template used when the model's tokenizer has no chat template."""
    return ChatTemplate("default", {
        "system": ("System: ", "\n\n"), "user": ("User: ", "\n"), "assistant": ("Assistant: ", "\n"),
    })


def named_chat_template(name: str) -> ChatTemplate | None:
    """SGLang's template names: ``"default"`` (radixlm's plain template) and those of
    ``lang/chat_template_registry.py`` (``chatml``, ``qwen``, ``llama-3-instruct``, ``gemma-it``,
    ...); ``None`` (with a warning) for others, meaning "derive from the tokenizer"."""
    from radixlm.lang.chat_template_registry import NAMED_TEMPLATES

    if name == "default":
        return default_chat_template()
    if name in NAMED_TEMPLATES:
        markers, system = NAMED_TEMPLATES[name]
        return ChatTemplate(name, dict(markers), system)
    logger.warning("unknown chat template name %r; deriving the template instead", name)
    return None


def _split(text: str, role: str) -> tuple[str, str]:
    sentinel = _SENTINEL[role]
    if text.count(sentinel) != 1:
        raise ValueError(f"template does not render {role} content verbatim")
    begin, end = text.split(sentinel)
    return begin, end


def _render(tokenizer: Any, turns: list[tuple[str, str]]) -> str:
    msgs = [{"role": r, "content": c} for r, c in turns]
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)


def _increments(tokenizer: Any, turns: list[tuple[str, str]]) -> list[str]:
    """Text that each turn adds to the rendering of the turns before it."""
    out, prev = [], ""
    for i in range(1, len(turns) + 1):
        whole = _render(tokenizer, turns[:i])
        if not whole.startswith(prev):
            raise ValueError("template rendering is not incremental")
        out.append(whole[len(prev):])
        prev = whole
    return out


def _encode_adds_bos(tokenizer: Any) -> bool:
    """True when encoding text prepends the BOS token (so the template's BOS must not be sent as
    text too).  SmolLM2's BOS is ``<|im_start|>``, which encoding does not add: it stays."""
    try:
        ids = tokenizer("x")["input_ids"]
        return bool(ids) and ids[0] == tokenizer.bos_token_id
    except Exception:  # noqa: BLE001 - unusual tokenizers: assume the common (Llama) behaviour
        return True


def _derive(tokenizer: Any, with_system: bool) -> dict[str, tuple[str, str]]:
    # NOTE: user/assistant markers come from the *second* exchange, so one-time text of the first
    # message (BOS, a default system prompt) is not repeated on every turn.
    s, u, a = (_SENTINEL[r] for r in ROLES)
    turns = [("user", u + "1"), ("assistant", a + "1"), ("user", u), ("assistant", a)]
    if with_system:
        turns.insert(0, ("system", s))
    inc = _increments(tokenizer, turns)
    markers = {"user": _split(inc[-2], "user"), "assistant": _split(inc[-1], "assistant")}
    if with_system:
        begin, end = _split(inc[0], "system")
        bos = getattr(tokenizer, "bos_token", None)
        if bos and begin.startswith(bos) and _encode_adds_bos(tokenizer):
            begin = begin[len(bos):]  # NOTE: the tokenizer adds BOS itself when encoding.
        markers["system"] = (begin, end)
    else:
        markers["system"] = markers["user"]
    return markers


def chat_template_from_tokenizer(tokenizer: Any) -> ChatTemplate:
    """Derive role markers from ``tokenizer.chat_template`` (a HF tokenizer).

    Renders a conversation (system, user, assistant, user, assistant) with sentinel contents and
    cuts each turn's increment around its sentinel; user/assistant markers come from the second
    exchange.  A leading BOS is dropped when encoding adds it.  Templates that reject or drop a
    system message give the system role the user markers.  Returns :func:`default_chat_template`
    when the tokenizer has no template or it cannot be rendered incrementally.
    """
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return default_chat_template()
    for with_system in (True, False):
        try:
            return ChatTemplate("tokenizer", _derive(tokenizer, with_system))
        except Exception as exc:  # noqa: BLE001 - any template failure means "try the next shape"
            logger.debug("chat template (system=%s) not derivable: %s", with_system, exc)
    logger.warning("could not derive role markers from the tokenizer's chat template; "
                   "using the default template")
    return default_chat_template()


def get_chat_template(name: str) -> ChatTemplate:
    """SGLang's lookup by name (see :func:`named_chat_template`); unknown names give the default
    template."""
    return named_chat_template(name) or default_chat_template()


def get_chat_template_by_model_path(model_path: str) -> ChatTemplate:
    """SGLang's lookup by model path: the tokenizer's template when ``model_path`` is a local
    folder with one, else the template SGLang's matchers pick from the path's name
    (``.../Llama-3.1-8B-Instruct`` -> ``llama-3-instruct``), else the default template."""
    import os

    from radixlm.lang.chat_template_registry import match_model_path

    if os.path.isdir(model_path):
        try:
            from transformers import AutoTokenizer

            return chat_template_from_tokenizer(AutoTokenizer.from_pretrained(model_path))
        except Exception as exc:  # noqa: BLE001 - fall back to the default template
            logger.warning("no chat template from %s: %s", model_path, exc)
    name = match_model_path(model_path)
    return (named_chat_template(name) if name else None) or default_chat_template()
