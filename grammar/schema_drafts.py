"""The keywords of a schema's own draft (``$schema``): what is not a keyword there is ignored.

A validator of draft 4 ignores ``const`` (a draft-6 keyword), one of draft 7 ignores
``dependentRequired``, one of 2020-12 ignores ``dependencies`` and ``additionalItems``; in drafts 3
to 7 a ``$ref`` also hides its sibling keywords. The converter applies every keyword it knows, so
before converting, :func:`apply_dialect` removes from each sub-schema the assertion keywords its
draft does not have, the draft chosen as ``jsonschema.validators.validator_for`` chooses it from
``$schema``. A schema that names no draft keeps every keyword (e.g. draft-7 tuple ``items`` with
``additionalItems``, which a 2020-12 validator would not read). Applying a keyword the validator ignores is not a safe restriction:
under ``not``, or in a ``oneOf`` branch, a stricter sub-schema accepts more.
"""

from __future__ import annotations

import json
from typing import Any

from radixlm.grammar.schema_merge import ASSERTIONS

# Keywords whose values are data, and maps from names to sub-schemas.
# NOTE: keywords whose values are data, not schemas; keywords whose values map names to schemas
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example", "x-examples"})
SCHEMA_MAPS = frozenset({"properties", "patternProperties", "definitions", "$defs", "dependentSchemas", "dependencies"})
# Keywords that the validators apply inside another one (``then`` / ``else`` through ``if``,
# ``exclusiveMinimum`` as a draft-4 boolean through ``minimum``, ...).
_COMPANIONS = {"then": "if", "else": "if", "exclusiveMinimum": "minimum", "exclusiveMaximum": "maximum"}
_CONTAINS_COUNTS = ("minContains", "maxContains")  # applied by ``contains`` from 2019-09 on


def dialect(root: Any) -> tuple[frozenset[str], bool]:
    """``(keywords, ref_alone)`` of the draft ``root`` declares: the assertion keywords its
    validator applies, and whether a ``$ref`` hides its siblings (drafts 3 to 7)."""
    import jsonschema

    cls = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)
    known = frozenset(cls.VALIDATORS)
    legacy = cls in (jsonschema.Draft3Validator, jsonschema.Draft4Validator, jsonschema.Draft6Validator,
                     jsonschema.Draft7Validator)
    return known, legacy


def apply_dialect(root: Any) -> Any:
    """A copy of ``root`` without the assertion keywords its draft ignores (see the module
    docstring); ``root`` itself when nothing is removed."""
    if not isinstance(root, dict):
        return root
    if not isinstance(root.get("$schema"), str):
        return root  # NOTE: no draft named: every keyword applies (what the schema's author meant)
    known, ref_alone = dialect(root)
    counts = "dependentRequired" in known  # 2019-09 and later
    defs = "$defs" if counts else "definitions"  # NOTE: where a dropped subschema with an $id is kept
    dropped = [False]

    def keep(schema: dict, key: str) -> bool:
        if key not in ASSERTIONS or key.startswith("x-"):
            return True
        if ref_alone and "$ref" in schema and key != "$ref":
            return False
        if key in known:
            return True
        if key in _CONTAINS_COUNTS:
            return counts and "contains" in schema
        owner = _COMPANIONS.get(key)
        return owner is not None and owner in known and owner in schema

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        out, kept = {}, {}
        for k, v in node.items():
            if not keep(node, k):
                dropped[0] = True
                if isinstance(v, dict) and ('"$id"' in json.dumps(v) or '"$anchor"' in json.dumps(v)):
                    kept[f"x-ignored:{k}"] = walk(v)  # NOTE: still a $ref target (an $id inside)
                continue
            if k in DATA_KEYWORDS:
                out[k] = v
            elif k in SCHEMA_MAPS and isinstance(v, dict):
                out[k] = {name: walk(sub) for name, sub in v.items()}
            else:
                out[k] = walk(v)
        if kept:
            out[defs] = {**out.get(defs, {}), **kept}
        return out

    got = walk(root)
    return got if dropped[0] else root
