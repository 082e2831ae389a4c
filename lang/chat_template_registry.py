"""SGLang's named chat templates as role markers, and its model-path matching.

``sglang.lang.chat_template`` registers templates by name (``get_chat_template("llama-3-instruct")``,
``RuntimeEndpoint(url, chat_template_name=...)``) and picks one from a model path when it cannot
read the model's tokenizer (``get_chat_template_by_model_path``).  The markers below are those
templates' role prefixes and suffixes (text formats of the model families).  Templates that need
more than fixed markers (SGLang's ``llama-2-chat`` merges the system prompt into the first
``[INST]``) are not listed; radixlm derives them from the tokenizer instead.
"""

from __future__ import annotations

ROLES = ("system", "user", "assistant")
Markers = dict[str, tuple[str, str]]


def _same(begin: str, end: str) -> Markers:
    """Markers where every role uses ``begin`` (with ``{role}`` filled in) and ``end``."""
    return {r: (begin.format(role=r), end) for r in ROLES}


_CHATML = _same("<|im_start|>{role}\n", "<|im_end|>\n")
_VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. "
                  "The assistant gives helpful, detailed, and polite answers to the user's "
                  "questions.")

#: name -> (role markers, default system prompt inserted before a first non-system message).
NAMED_TEMPLATES: dict[str, tuple[Markers, str | None]] = {
    "chatml": (_CHATML, None),
    "qwen": (_CHATML, "You are a helpful assistant."),
    "claude": ({"system": ("", ""), "user": ("\n\nHuman: ", ""),
                "assistant": ("\n\nAssistant:", "")}, None),
    "vicuna_v1.1": ({"system": ("", " "), "user": ("USER:", " "),
                     "assistant": ("ASSISTANT:", "</s>")}, _VICUNA_SYSTEM),
    "llama-3-instruct": (_same("<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>"),
                         None),
    "llama-4": (_same("<|header_start|>{role}<|header_end|>\n\n", "<|eot|>"), None),
    "yi-1.5": ({"system": ("", ""), "user": ("<|im_start|>user\n",
                                             "<|im_end|>\n<|im_start|>assistant\n"),
                "assistant": ("", "<|im_end|>\n")}, None),
    "gemma-it": ({"system": ("", ""), "user": ("<start_of_turn>user\n", "<end_of_turn>\n"),
                  "assistant": ("<start_of_turn>model\n", "<end_of_turn>\n")}, None),
    "c4ai-command-r": ({"system": ("<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
                        "user": ("<|START_OF_TURN_TOKEN|><|USER_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
                        "assistant": ("<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
                                      "<|END_OF_TURN_TOKEN|>")}, None),
    "granite-3-instruct": (_same("<|start_of_role|>{role}<|end_of_role|>", "<|end_of_text|>"),
                           None),
    "deepseek-v3": ({"system": ("", ""), "user": ("<｜User｜>", ""),
                     "assistant": ("<｜Assistant｜>", "<｜end▁of▁sentence｜>")}, None),
}


def match_model_path(model_path: str) -> str | None:
    """The template name SGLang's matchers pick for ``model_path`` (plus ``smollm`` -> chatml,
    radixlm's default model family), or ``None`` when none matches."""
    p = model_path.lower()
    rules: list[tuple[bool, str]] = [
        (("deepseek-v3" in p or "deepseek-r1" in p) and "base" not in p, "deepseek-v3"),
        ("vicuna" in p or "llava-v1.5" in p, "vicuna_v1.1"),
        ("llama-3" in p and "instruct" in p, "llama-3-instruct"),
        ("llama-4" in p and "instruct" in p, "llama-4"),
        ("tinyllama" in p or "smollm" in p, "chatml"),
        ("qwen" in p and "vl" not in p and ("chat" in p or "instruct" in p), "qwen"),
        ("yi-1.5" in p and "chat" in p, "yi-1.5"),
        ("gemma" in p and "it" in p, "gemma-it"),
        ("c4ai-command-r" in p, "c4ai-command-r"),
        ("granite" in p and "instruct" in p, "granite-3-instruct"),
    ]
    return next((name for hit, name in rules if hit), None)
