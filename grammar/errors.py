"""The one exception the grammar engine raises for input it cannot take."""

from __future__ import annotations


class GrammarError(ValueError):
    """Invalid or unsupported grammar input; the message names the feature (e.g. the JSON-Schema
    keyword) so that the runtime can abort just that request with a clear reason."""
