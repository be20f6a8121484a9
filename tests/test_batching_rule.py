"""The Triton rule lives in one module that the simulator and batcher share; the arrivals in one the simulator and load generator share."""

from __future__ import annotations

import course_lib.measure.loadgen as loadgen
import course_lib.serving.batching.batcher as batcher
import course_lib.simulate.batching as simulator
import course_lib.simulate.traffic as traffic
from course_lib.serving.batching import rule as batching_rule


def test_simulator_batcher_and_loadgen_use_the_one_rule():
    assert simulator.next_batch_size is batching_rule.next_batch_size
    assert simulator.check_batching_params is batching_rule.check_batching_params
    assert batcher.next_batch_size is batching_rule.next_batch_size
    assert batcher.check_batching_params is batching_rule.check_batching_params
    assert loadgen.poisson_arrivals_ms is traffic.poisson_arrivals_ms
    assert simulator.poisson_arrivals_ms is traffic.poisson_arrivals_ms


def test_the_rule_module_imports_nothing_but_core():
    source = batching_rule.__file__
    with open(source, encoding="utf-8") as fh:
        imports = [line for line in fh if line.startswith(("import ", "from "))]
    assert not [line for line in imports if "course_lib" in line and "course_lib.core" not in line], imports
