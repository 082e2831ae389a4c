"""Remote ``$ref``s (never fetched), replaced soundly by what they may be, given their polarity.

:func:`radixlm.grammar.schema_refs.canonical_refs` marks a ``$ref`` to another document
``x-remote:URI``; :func:`approximate` then rewrites the schema so that it accepts a subset of what
the real schema accepts, whatever the remote document holds:

- positive positions (``properties``, ``items``, ``anyOf`` / ``allOf`` branches, ``then`` /
  ``else``, ``contains``, ``propertyNames``, ``dependentSchemas``, ...): the sub-schema holding the
  ``$ref`` (its sibling keywords too) becomes ``false``, so that part is never produced;
- negative positions (under ``not``; the polarity flips again under each nested ``not``): ``true``;
- ``if`` holding one: positive ``then and else``, negative ``then or else`` (absent ones ``true``);
- a ``oneOf`` holding one in a branch: positive, ``oneOf`` of the branches approximated from above
  and ``anyOf`` of them approximated from below (the one branch that holds is the one from below:
  exactly one branch of the original holds); negative, ``anyOf`` of the branches from above;
- ``contains`` holding one beside ``maxContains``: the whole sub-schema ``false`` (``true`` when
  negative); ``unevaluatedProperties`` / ``unevaluatedItems`` beside an in-place rewrite that
  could mark more values evaluated (an ``if`` or ``oneOf`` above; when negative, any rewrite):
  likewise.

A local ``$ref`` whose target holds a remote one points to a copy of the target approximated in
the reference's own polarity (under the root key :data:`TABLE`) unless the target's place in the
output already holds that approximation.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

from radixlm.grammar.budget import check_budget
from radixlm.grammar.errors import GrammarError
from radixlm.grammar.schema_drafts import DATA_KEYWORDS, SCHEMA_MAPS
from radixlm.grammar.schema_refs import ROOT_URI, _escape, pointer_parts

logger = logging.getLogger(__name__)

REMOTE = "x-remote:"
TABLE = "x-radixlm-approx"
_ONE = ("additionalProperties", "unevaluatedProperties", "propertyNames", "additionalItems", "unevaluatedItems",
        "items", "contains", "if", "then", "else", "not")
_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAPS = ("properties", "patternProperties", "dependentSchemas", "dependencies")
_DEFS = ("$defs", "definitions")
_IN_PLACE = frozenset({"allOf", "anyOf", "oneOf", "if", "then", "else", "dependentSchemas", "dependencies"})


def _children(node: dict) -> Iterator[tuple[str, str, Any]]:
    """``(keyword, pointer suffix, sub-schema)`` of every applicator position of ``node``
    (``$defs`` excluded: they apply nowhere by themselves)."""
    for k, v in node.items():
        if k in _ONE and isinstance(v, (dict, bool)):
            yield k, "/" + _esc(k), v
        elif k in _LISTS and isinstance(v, list):
            for i, sub in enumerate(v):
                if isinstance(sub, (dict, bool)):
                    yield k, f"/{_esc(k)}/{i}", sub
        elif k in _MAPS and isinstance(v, dict):
            for name, sub in v.items():
                if isinstance(sub, (dict, bool)):
                    yield k, f"/{_esc(k)}/{_esc(name)}", sub


def _esc(part: Any) -> str:
    return _escape(str(part))


def _local(ref: Any) -> str | None:
    """The pointer (``#...``) of a canonical local ``$ref``, else None."""
    if isinstance(ref, str) and ref.startswith(ROOT_URI + "#"):
        return ref[len(ROOT_URI):]
    return None


class _Approximator:
    """One rewrite of a canonical document (see :func:`approximate`)."""

    def __init__(self, doc: dict) -> None:
        self.doc = doc
        self.nodes: dict[str, Any] = {}  # pointer -> node of the canonical document
        self.remote_at: set[str] = set()  # pointers whose target holds a remote $ref (through refs)
        self.memo: dict[int, bool] = {}
        self.placed: set[tuple] = set()  # keys whose approximation sits at its own pointer
        self.patches: list[tuple[dict, tuple]] = []  # ($ref holder of the output, key) to name
        self.table: dict[str, Any] = {}
        self.names: dict[tuple, str] = {}
        self.uris: list[str] = []
        self._find_remote()

    # --- which sub-schemas hold a remote $ref -------------------------------------------------

    def node_at(self, pointer: str) -> Any:
        """The canonical document's node at ``pointer`` (``#/a/b``), or None."""
        if pointer not in self.nodes:
            self.nodes[pointer] = _follow(self.doc, pointer)[1]
        return self.nodes[pointer]

    def _find_remote(self) -> None:
        refs: list[str] = []
        self._collect(self.doc, refs)
        edges: dict[str, set[str]] = {}  # target q -> pointers p whose target refers to q
        todo = []
        for p in dict.fromkeys(refs):
            found: set[str] = set()
            if self._scan(self.node_at(p), found):
                todo.append(p)
            for q in found:
                edges.setdefault(q, set()).add(p)
        while todo:
            p = todo.pop()
            if p not in self.remote_at:
                self.remote_at.add(p)
                todo.extend(edges.get(p, ()))

    def _collect(self, node: Any, refs: list[str]) -> None:
        if isinstance(node, list):
            for x in node:
                self._collect(x, refs)
        elif isinstance(node, dict):
            for k, v in node.items():
                if k == "$ref":
                    if _local(v) is not None:
                        refs.append(_local(v))
                    elif isinstance(v, str) and v.startswith(REMOTE) and v[len(REMOTE):] not in self.uris:
                        self.uris.append(v[len(REMOTE):])
                elif k in SCHEMA_MAPS and isinstance(v, dict):
                    for sub in v.values():
                        self._collect(sub, refs)
                elif k not in DATA_KEYWORDS:
                    self._collect(v, refs)

    def _scan(self, node: Any, found: set[str]) -> bool:
        """Whether ``node`` holds a remote ``$ref`` itself (not through local ones, which go to
        ``found``)."""
        if not isinstance(node, dict):
            return False
        check_budget("approximating remote $refs", 2)
        ref = node.get("$ref")
        hit = isinstance(ref, str) and ref.startswith(REMOTE)
        if _local(ref) is not None:
            found.add(_local(ref))
        for _, _, sub in _children(node):
            hit = self._scan(sub, found) or hit
        return hit

    def has_remote(self, node: Any) -> bool:
        """Whether ``node`` depends on a remote ``$ref`` (in place or through local ones)."""
        if not isinstance(node, dict):
            return False
        got = self.memo.get(id(node))
        if got is None:
            ref = node.get("$ref")
            got = (isinstance(ref, str) and ref.startswith(REMOTE)) or _local(ref) in self.remote_at
            got = got or any(self.has_remote(sub) for _, _, sub in _children(node))
            self.memo[id(node)] = got
        return got

    def reaches(self, node: Any, hit: Callable[[dict], bool], seen: set[int]) -> bool:
        """Whether ``hit`` holds for ``node`` or a sub-schema applied in place (through local refs)."""
        if not isinstance(node, dict) or id(node) in seen:
            return False
        check_budget("approximating remote $refs", 1)
        seen.add(id(node))
        if hit(node):
            return True
        target = self.node_at(_local(node["$ref"])) if _local(node.get("$ref")) is not None else None
        return self.reaches(target, hit, seen) or any(
            self.reaches(sub, hit, seen) for k, _, sub in _children(node) if k in _IN_PLACE)

    def _remote_if(self, node: dict) -> bool:
        return self.has_remote(node.get("if"))

    def _remote_choice(self, node: dict) -> bool:
        """Whether :meth:`conv` rewrites an ``if`` or a ``oneOf`` of ``node`` (more branches may
        then hold, marking more keys / items evaluated)."""
        one_of = node.get("oneOf")
        return self._remote_if(node) or (isinstance(one_of, list) and any(self.has_remote(b) for b in one_of))

    def _rewritten(self, node: dict) -> bool:
        """Whether :meth:`conv` drops or replaces keywords of ``node`` (not only deeper ones)."""
        ref = node.get("$ref")
        one_of = node.get("oneOf")
        return ((isinstance(ref, str) and ref.startswith(REMOTE)) or self._remote_if(node)
                or (isinstance(one_of, list) and any(self.has_remote(b) for b in one_of))
                or ("maxContains" in node and self.has_remote(node.get("contains")))
                or (self.has_remote(node) and ("unevaluatedProperties" in node or "unevaluatedItems" in node)))

    # --- the rewrite -----------------------------------------------------------------------------

    def conv(self, node: Any, positive: bool, src: str, out: str | None) -> Any:
        """``node`` (at pointer ``src``) approximated from below (``positive``) or from above;
        ``out``: its pointer in the output when it is the same place, else None."""
        if not self.has_remote(node):
            return self.plain(node, src, out)
        check_budget("approximating remote $refs", 3)
        if out == src:
            self.placed.add((src, positive))
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(REMOTE):
            return not positive
        if "unevaluatedProperties" in node or "unevaluatedItems" in node:
            hazard = self._remote_choice if positive else self._rewritten
            if self.reaches(node, hazard, set()):  # NOTE: evaluated keys could grow (see the module docstring)
                return not positive
        if "maxContains" in node and self.has_remote(node.get("contains")):
            return not positive
        remote_if = self._remote_if(node)
        one_of = node.get("oneOf")
        remote_one_of = isinstance(one_of, list) and any(self.has_remote(b) for b in one_of)
        res: dict = {}
        for k, v in node.items():
            path = f"{src}/{_esc(k)}"
            at = f"{out}/{_esc(k)}" if out is not None else None
            if k == "$ref":
                self.ref(res, v, positive)
            elif (remote_if and k in ("if", "then", "else")) or (remote_one_of and k == "oneOf"):
                continue
            elif k == "not" and isinstance(v, (dict, bool)):
                res[k] = self.conv(v, not positive, path, at)
            elif k in _ONE and isinstance(v, (dict, bool)):
                res[k] = self.conv(v, positive, path, at)
            elif k in _LISTS and isinstance(v, list):
                res[k] = [self.conv(x, positive, f"{path}/{i}", at and f"{at}/{i}") for i, x in enumerate(v)]
            elif k in _MAPS and isinstance(v, dict):
                res[k] = {n: self.conv(x, positive, f"{path}/{_esc(n)}", at and f"{at}/{_esc(n)}")
                          if isinstance(x, (dict, bool)) else x for n, x in v.items()}
            elif k in _DEFS and isinstance(v, dict):
                res[k] = {n: self.conv(x, True, f"{path}/{_esc(n)}", at and f"{at}/{_esc(n)}")
                          for n, x in v.items()}
            else:
                res[k] = _scrub(v) if k not in DATA_KEYWORDS else v
        extra: list = []
        if remote_if:
            sides = [self.conv(node.get(k, True), positive, f"{src}/{k}", None) for k in ("then", "else")]
            if positive:
                extra += [s for s in sides if s is not True]
            elif not any(s is True for s in sides):
                extra.append({"anyOf": sides})
        if remote_one_of:
            if positive:  # NOTE: exactly one branch from above, one of them from below (see the module docstring)
                below = [self.conv(b, True, f"{src}/oneOf/{i}", None) for i, b in enumerate(one_of)]
                above = [self.conv(b, False, f"{src}/oneOf/{i}", None) if self.has_remote(b) else below[i]
                         for i, b in enumerate(one_of)]
                if all(b is False for b in below) or any(a is True and b is False for a, b in zip(above, below)):
                    return False
                res["oneOf"] = above
                extra.append({"anyOf": below})
            else:
                above = [self.conv(b, False, f"{src}/oneOf/{i}", None) for i, b in enumerate(one_of)]
                if not any(a is True for a in above):
                    extra.append({"anyOf": above})
        if extra:
            res["allOf"] = list(res.get("allOf", [])) + extra
        any_of = res.get("anyOf")
        if any(x is False for x in res.get("allOf", ())) or (
                isinstance(any_of, list) and any_of and all(x is False for x in any_of)):
            return False  # NOTE: exact (also when negative)
        return res

    def plain(self, node: Any, src: str, out: str | None) -> Any:
        """A copy of ``node`` (no remote ``$ref`` reached from it) with its local refs renamed."""
        if isinstance(node, list):
            return [self.plain(x, f"{src}/{i}", out and f"{out}/{i}") for i, x in enumerate(node)]
        if not isinstance(node, dict):
            return node
        check_budget("approximating remote $refs", 3)
        if out == src:
            self.placed.add((src, None))
        res: dict = {}
        for k, v in node.items():
            if k == "$ref":
                self.ref(res, v, None)
            elif k in SCHEMA_MAPS and isinstance(v, dict):
                res[k] = {n: self.plain(x, f"{src}/{_esc(k)}/{_esc(n)}", out and f"{out}/{_esc(k)}/{_esc(n)}")
                          for n, x in v.items()}
            elif k in DATA_KEYWORDS:
                res[k] = v
            else:
                res[k] = self.plain(v, f"{src}/{_esc(k)}", out and f"{out}/{_esc(k)}")
        return res

    def ref(self, res: dict, ref: Any, positive: bool | None) -> None:
        """Put ``ref`` (a local or boolean canonical ``$ref``) into ``res``, named once the
        approximation it needs is known (:meth:`finish`)."""
        pointer = _local(ref)
        if pointer is None:
            res["$ref"] = "x-bool:false" if isinstance(ref, str) and ref.startswith(REMOTE) else ref
            return
        res["$ref"] = ref
        self.patches.append((res, (pointer, positive if pointer in self.remote_at else None)))

    def finish(self, root: Any) -> Any:
        """Name every local ``$ref`` of the output; the copies it needs go under :data:`TABLE`."""
        while self.patches:
            res, key = self.patches.pop()
            pointer, positive = key
            if key in self.placed and _follow(root, pointer)[0]:  # NOTE: not where an enclosing one became a boolean
                res["$ref"] = ROOT_URI + pointer
                continue
            name = self.names.get(key)
            if name is None:
                name = self.names[key] = str(len(self.names))
                self.table[name] = None
                target = self.node_at(pointer)
                self.table[name] = (self.plain(target, pointer, None) if positive is None
                                    else self.conv(target, positive, pointer, None))
            res["$ref"] = f"{ROOT_URI}#/{TABLE}/{name}"
        if self.table:
            root[TABLE] = self.table
        return root


def _follow(doc: Any, pointer: str) -> tuple[bool, Any]:
    """``(found, node)`` at ``pointer`` (``#/a/b``) in ``doc``."""
    node = doc
    for part in pointer_parts(ROOT_URI + pointer) or []:
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return False, None
    return True, node


def _scrub(node: Any) -> Any:
    """A copy of a non-schema value with its remote ``$ref`` markers made ``false``."""
    if isinstance(node, list):
        return [_scrub(x) for x in node]
    if isinstance(node, dict):
        return {k: ("x-bool:false" if k == "$ref" and isinstance(v, str) and v.startswith(REMOTE) else _scrub(v))
                for k, v in node.items()}
    return node


def approximate(doc: Any) -> Any:
    """``doc`` (canonical: local ``$ref``s ``ROOT_URI#/pointer``, remote ones ``x-remote:URI``)
    with every remote ``$ref`` replaced by a sound approximation (see the module docstring); logs
    one warning naming the remote references.

    Raises:
        GrammarError: the schema accepts nothing without its remote documents (its root became
            ``false``).
    """
    if not isinstance(doc, dict):
        return doc
    job = _Approximator(doc)
    if not job.uris:
        return doc
    root = job.conv(doc, True, "#", "#")
    shown = ", ".join(repr(u) for u in job.uris[:5]) + (f" and {len(job.uris) - 5} more" if len(job.uris) > 5 else "")
    if root is False:
        raise GrammarError(f"remote $ref {shown} does not resolve within the schema (remote documents are not "
                           "fetched) and without it the schema accepts nothing")
    if not isinstance(root, dict):
        return root
    logger.warning("JSON Schema: remote $ref %s not fetched; the parts of the schema that need it are "
                   "never produced", shown)
    return job.finish(root)
