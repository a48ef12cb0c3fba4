"""corps.patterns: the built-in multi-agent workflows.

Each pattern is an async function `pattern(rt, inputs..., *, settings...) ->
PatternResult` that spawns its agents in `rt` (names unique per run),
choreographs parents and offsets explicitly, and runs unchanged in both engine
modes (choreographed, baseline).
"""

from corps.patterns.branch_solve_merge import branch_solve_merge
from corps.patterns.debate import debate
from corps.patterns.map_reduce import map_reduce
from corps.patterns.multi_qa import multi_qa
from corps.patterns.parallel_debate import parallel_debate
from corps.patterns.prisoners_dilemma import prisoners_dilemma
from corps.patterns.registry import PATTERNS, BadParameters, UnknownPattern, run_pattern
from corps.patterns.result import PatternResult
from corps.patterns.tree_of_thoughts import tree_of_thoughts

__all__ = [
    "PATTERNS",
    "BadParameters",
    "PatternResult",
    "UnknownPattern",
    "branch_solve_merge",
    "debate",
    "map_reduce",
    "multi_qa",
    "parallel_debate",
    "prisoners_dilemma",
    "run_pattern",
    "tree_of_thoughts",
]
