"""Process-wide frontend settings with SGLang's names (``sglang.global_config.global_config``).

SGLang programs read and write these attributes directly (``global_config.verbosity = 2``,
``global_config.default_backend = backend``), so the interpreter reads them at the point of use:

* ``default_backend`` (None): what ``run``/``run_batch`` use without ``backend=``; a Backend, an
  ``Engine`` or a ``Runtime`` (``set_default_backend`` stores here).
* ``verbosity`` (0): 2 prints each program's final text after ``run``.
* ``enable_precache_with_tracing`` (True): ``run_batch`` of more than one program first commits the
  traced constant prefix (one prefill-only request).
* ``enable_parallel_encoding`` (True): accepted; ``join("concate_and_append")`` always appends text.
* ``enable_cache_leases`` (True) / ``cache_lease_ttl_s`` (60.0): radixlm only: a running
  program's requests lease their cached prefix for that many seconds (renewed on each call,
  released at the program's end; ``interpreter/lease.py``). Ignored by backends without leases.
* ``skip_special_tokens_in_output`` (True) / ``spaces_between_special_tokens_in_out`` (True): sent
  as ``skip_special_tokens`` / ``spaces_between_special_tokens`` with every generation.

The runtime constants of SGLang's object (token-ratio estimation, retraction, flashinfer workspace)
exist with SGLang's defaults for compatibility; radixlm's runtime takes its settings from its server
arguments instead and does not read them.
"""

from __future__ import annotations

import os
from typing import Any


class GlobalConfig:
    """Mutable settings object; see the module docstring for what each attribute does."""

    def __init__(self) -> None:
        self.verbosity = 0
        self.default_backend: Any = None
        self.default_init_new_token_ratio = float(os.environ.get("SGLANG_INIT_NEW_TOKEN_RATIO", 0.7))
        self.default_min_new_token_ratio_factor = float(
            os.environ.get("SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR", 0.14))
        self.default_new_token_ratio_decay_steps = float(
            os.environ.get("SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS", 600))
        self.retract_decode_steps = 20
        self.flashinfer_workspace_size = int(os.environ.get("FLASHINFER_WORKSPACE_SIZE",
                                                            384 * 1024 * 1024))
        self.skip_special_tokens_in_output = True
        self.spaces_between_special_tokens_in_out = True
        self.enable_precache_with_tracing = True
        self.enable_parallel_encoding = True
        self.enable_cache_leases = True
        self.cache_lease_ttl_s = 60.0

    def __repr__(self) -> str:
        return f"GlobalConfig({vars(self)!r})"


global_config = GlobalConfig()
