"""``$ref`` resolution with the ``referencing`` library (the jsonschema project's resolver).

:func:`canonical_refs` rewrites every ``$ref`` of a schema (local pointers, ``$defs`` /
``definitions``, ``$anchor`` / draft-4 ``id`` anchors, references relative to a nested ``$id``)
into one canonical form, ``ROOT_URI#/json/pointer`` into the root document, so that the rest of
the converter only ever follows plain JSON pointers. References to other documents are never
fetched: they are replaced by sound approximations (:mod:`radixlm.grammar.schema_remote`: the
parts of the schema that need them are never produced). A reference into the document itself
that does not resolve (``#/definitions/nope``, an unknown anchor) is a :class:`GrammarError`.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, unquote, urldefrag, urljoin

from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT4, DRAFT7, DRAFT202012, specification_with

from radixlm.grammar.budget import check_budget
from radixlm.grammar.errors import GrammarError

ROOT_URI = "urn:radixlm:root"
# Keywords whose values are data, not schemas: never look for "$ref" / "$id" inside them.
_DATA = frozenset({"enum", "const", "default", "examples", "example", "x-examples"})
_MAPS = frozenset({"properties", "patternProperties", "definitions", "$defs", "dependentSchemas", "dependencies"})


def _escape(part: str) -> str:
    return quote(part.replace("~", "~0").replace("/", "~1"), safe="~!$&'()*+,;=:@")


def _specification(root: Any) -> Any:
    dialect = root.get("$schema") if isinstance(root, dict) else None
    if isinstance(dialect, str):
        try:
            return specification_with(dialect.rstrip("#") + "#" if "draft-0" in dialect else dialect,
                                      default=DRAFT202012)
        except Exception:  # noqa: BLE001 - an unknown dialect: use the latest
            return DRAFT202012
    return DRAFT202012


def registry_for(root: Any) -> Registry:
    """A registry holding ``root`` under :data:`ROOT_URI` (and its embedded ``$id`` resources).
    The dialect comes from ``$schema``; a schema that does not crawl under it (e.g. draft-7 tuple
    ``items`` without ``$schema``) is retried as draft 7 and draft 4, then used uncrawled."""
    first = _specification(root)
    uris = [ROOT_URI] + ([root_base(root)] if root_base(root) != ROOT_URI else [])
    for spec in (first, DRAFT7, DRAFT4):
        try:
            resource = Resource(contents=root, specification=spec)
            return Registry().with_resources((u, resource) for u in uris).crawl()
        except Exception:  # noqa: BLE001 - the crawl walks keywords by the dialect's rules
            continue
    return Registry().with_resources((u, Resource(contents=root, specification=first)) for u in uris)


def root_base(root: Any) -> str:
    """The base URI of the root document: its ``$id`` (draft 4: ``id``) or :data:`ROOT_URI`."""
    ident = root.get("$id", root.get("id")) if isinstance(root, dict) else None
    if isinstance(ident, str) and ident.split("#")[0]:
        return urljoin(ROOT_URI, ident.split("#")[0])
    return ROOT_URI


def canonical_refs(root: Any) -> Any:
    """A copy of ``root`` whose ``$ref`` values are all ``ROOT_URI#/pointer`` (or ``x-bool:true`` /
    ``x-bool:false`` for boolean targets); ``$ref``s to other documents (the reference resolved
    against the base ``$id`` names a document that neither the root nor an embedded ``$id``
    declares) are approximated soundly (:func:`radixlm.grammar.schema_remote.approximate`, one
    logged warning naming them).

    Raises:
        GrammarError: a ``$ref`` into the document itself that does not resolve, an invalid
            ``$ref``, or a schema that accepts nothing without its remote documents.
    """
    if not isinstance(root, dict):
        return root
    if '"$ref"' not in json.dumps(root):
        return root
    where: dict[int, str] = {}
    _index(root, "", where)
    registry = registry_for(root)
    draft4 = _specification(root).name in ("draft-03", "draft-04")
    # NOTE: up to draft 7 a $ref hides its siblings, $id included: it does not move the base URI
    ref_alone = _specification(root).name in ("draft-03", "draft-04", "draft-06", "draft-07")
    resolvers: dict[str, Any] = {}
    documents: list[set[str]] = []  # NOTE: computed at the first reference that does not resolve
    remote: list[str] = []

    def target(ref: str, base: str) -> Any:
        resolver = resolvers.get(base)
        if resolver is None:
            resolver = resolvers[base] = registry.resolver(base_uri=base)
        try:
            return resolver.lookup(ref).contents
        except Unresolvable:
            uri = urljoin(base, ref)
            if not documents:
                documents.append(_documents(root, registry, draft4))
            if urldefrag(uri)[0] in documents[0]:
                raise GrammarError(f"$ref {ref!r} does not resolve within the schema") from None
            remote.append(uri)
            return _REMOTE
        except Exception as e:  # noqa: BLE001 - malformed references of every kind
            raise GrammarError(f"$ref {ref!r} is invalid: {e}") from None

    def walk(node: Any, base: str) -> Any:
        check_budget("resolving $ref")
        if isinstance(node, list):
            return [walk(x, base) for x in node]
        if not isinstance(node, dict):
            return node
        ident = node.get("$id", node.get("id") if draft4 else None)
        if isinstance(ident, str) and node is not root and not (ref_alone and "$ref" in node):
            base = urljoin(base, ident.split("#")[0]) if not ident.startswith("#") else base
        out: dict = {}
        for k, v in node.items():
            if k in _MAPS and isinstance(v, dict):  # names -> schemas: a name is not a keyword
                out[k] = {name: walk(sub, base) for name, sub in v.items()}
            elif k == "$ref" and isinstance(v, str):
                got = target(v, base)
                if got is _REMOTE:
                    out[k] = "x-remote:" + remote[-1]
                elif isinstance(got, bool):
                    out[k] = "x-bool:" + ("true" if got else "false")
                elif id(got) in where:
                    out[k] = ROOT_URI + "#" + where[id(got)]
                else:
                    raise GrammarError(f"$ref {v!r} does not resolve to a schema")
            elif k in _DATA:
                out[k] = v
            else:
                out[k] = walk(v, base)
        return out

    out = walk(root, root_base(root))
    if not remote:
        return out
    from radixlm.grammar.schema_remote import approximate

    return approximate(out)


_REMOTE = object()  # the target of a reference to another document (see canonical_refs)


def _documents(root: Any, registry: Registry, draft4: bool) -> set[str]:
    """The URIs (no fragment) of the documents the schema holds: the root's names and every
    embedded ``$id`` (draft 4: ``id``) resolved against its parents', and ``""`` (same document)."""
    found = {"", ROOT_URI, root_base(root)} | {urldefrag(u)[0] for u in registry}

    def walk(node: Any, base: str) -> None:
        if isinstance(node, list):
            for x in node:
                walk(x, base)
        elif isinstance(node, dict):
            ident = node.get("$id", node.get("id") if draft4 else None)
            if isinstance(ident, str) and not ident.startswith("#"):
                base = urljoin(base, urldefrag(ident)[0])
                found.add(base)
            for k, v in node.items():
                if k not in _DATA:
                    walk(v, base)

    walk(root, root_base(root))
    return found


def _index(node: Any, pointer: str, where: dict[int, str]) -> None:
    """JSON pointer of every object / array of the document (first occurrence)."""
    if isinstance(node, dict):
        if id(node) in where:
            return
        where[id(node)] = pointer
        for k, v in node.items():
            _index(v, pointer + "/" + _escape(str(k)), where)
    elif isinstance(node, list):
        if id(node) in where:
            return
        where[id(node)] = pointer
        for i, v in enumerate(node):
            _index(v, f"{pointer}/{i}", where)


def pointer_parts(ref: str) -> list[str] | None:
    """The decoded pointer of a canonical ``$ref`` (None for a boolean target marker)."""
    if ref.startswith("x-bool:"):
        return None
    path = ref[len(ROOT_URI):] if ref.startswith(ROOT_URI) else ref
    if not path.startswith("#"):
        raise GrammarError(f"$ref to another document is not supported: {ref!r}")
    path = unquote(path[1:])
    if path and not path.startswith("/"):
        raise GrammarError(f"$ref {ref!r} does not resolve")
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]] if path else []
