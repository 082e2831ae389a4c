"""``radixlm.global_config``: the module path of ``sglang.global_config`` (see
:mod:`radixlm.lang.global_config`)."""

from radixlm.lang.global_config import GlobalConfig, global_config

__all__ = ["GlobalConfig", "global_config"]
