"""API speculative execution for ``sgl.OpenAI`` (``@function(num_api_spec_tokens=N)``).

SGLang's semantics, per program state:

* Chat models: inside an assistant turn, text and ``gen`` calls are not sent one by one.  They are
  recorded as a format (``SpecTerm`` list); at the end of the turn ONE chat call of up to N tokens
  produces the whole turn, which is matched against the format: literal text must appear verbatim,
  a gen takes the text up to its stop string (the last gen takes the rest).  Up to 3 calls are made
  until the completion matches; the matched pieces become the text and the variables.
* Completion models: a gen whose speculated text is used up makes one call of
  ``max(max_tokens, N)`` tokens without stop strings and keeps the completion; this and following
  gens take their value from it (up to their stop, else ``max_tokens`` characters); literal text
  the program appends consumes the speculated text when it matches and discards it otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_TRIES = 3


@dataclass
class SpecTerm:
    """One piece of a speculated assistant turn: literal ``text`` (name None) or a gen."""

    text: str
    stop: str | list[str] | None = None
    name: str | None = None


@dataclass
class SpecTurn:
    """The recorded format of the current assistant turn and the call's sampling arguments."""

    terms: list[SpecTerm] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def has_gen(self) -> bool:
        return any(t.name is not None or t.text == "" for t in self.terms)


def find_stop(text: str, stop: str | list[str] | tuple[str, ...] | None) -> int:
    """Earliest position of any stop string in ``text``; -1 when none occurs (or no stop)."""
    if stop is None:
        return -1
    stops = [stop] if isinstance(stop, str) else list(stop)
    hits = [p for p in (text.find(s) for s in stops if s) if p != -1]
    return min(hits) if hits else -1


def match_turn(terms: list[SpecTerm], comp: str) -> bool:
    """Fill the gen terms of ``terms`` from ``comp``; False (terms partly filled) on a mismatch."""
    for i, term in enumerate(terms):
        if term.name is None and term.text:
            if not comp.startswith(term.text):
                return False
            comp = comp[len(term.text):]
            continue
        pos = find_stop(comp, term.stop)
        if pos != -1:
            term.text, comp = comp[:pos], comp[pos:]
        elif i == len(terms) - 1:
            term.text, comp = comp, ""
        else:
            return False
    return True


def take_speculated(speculated: str, stop: Any, max_new_tokens: int) -> tuple[str, str]:
    """Completion-model spec: ``(value, rest)`` of the speculated text for one gen."""
    if stop is None or stop == [] or stop == ():
        return speculated[:max_new_tokens], speculated[max_new_tokens:]
    pos = find_stop(speculated, stop)
    if pos == -1:
        pos = min(max_new_tokens, len(speculated))
    return speculated[:pos], speculated[pos:]
