"""Module path of ``sglang.lang.interpreter``: the program state classes and run entry points."""

from radixlm.interpreter.executor import StreamExecutor
from radixlm.interpreter.runner import cache_program, run_program, run_program_batch
from radixlm.interpreter.state import ForkedStates, ProgramState, ProgramStateGroup

__all__ = ["ForkedStates", "ProgramState", "ProgramStateGroup", "StreamExecutor", "cache_program",
           "run_program", "run_program_batch"]
