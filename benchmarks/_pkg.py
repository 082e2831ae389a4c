"""Import bootstrap for benchmarks run as scripts on machines where radixlm is not installed."""

from __future__ import annotations

import os
import sys


def ensure_radixlm() -> None:
    """Make ``import radixlm`` work: when it is not installed, map the repository root onto the
    name through a symlink under /tmp/radixlm_pkg (as benchmarks/h200_*.sh do)."""
    try:
        import radixlm  # noqa: F401
    except ImportError:
        pkg = "/tmp/radixlm_pkg"
        os.makedirs(pkg, exist_ok=True)
        if not os.path.exists(f"{pkg}/radixlm"):
            os.symlink(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), f"{pkg}/radixlm")
        sys.path.insert(0, pkg)
