"""The Triton rule and the arrival process live in one module that the simulator, batcher and load generator share."""

from __future__ import annotations

import course_lib.batcher as batcher
import course_lib.loadgen as loadgen
import course_lib.simulator as simulator
from course_lib import batching_rule


def test_simulator_batcher_and_loadgen_use_the_one_rule():
    assert simulator.next_batch_size is batching_rule.next_batch_size
    assert simulator.check_batching_params is batching_rule.check_batching_params
    assert batcher.next_batch_size is batching_rule.next_batch_size
    assert batcher.check_batching_params is batching_rule.check_batching_params
    assert loadgen.poisson_arrivals_ms is batching_rule.poisson_arrivals_ms
    assert simulator.poisson_arrivals_ms is batching_rule.poisson_arrivals_ms


def test_the_rule_module_imports_no_other_course_module():
    source = batching_rule.__file__
    with open(source, encoding="utf-8") as fh:
        imports = [line for line in fh if line.startswith(("import ", "from "))]
    assert not [line for line in imports if "course_lib" in line], imports
