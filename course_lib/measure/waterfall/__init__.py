"""The whole service measured: the waterfall from prototype to production, its floor, k6 beside it, its peers.

* ``_steps``: ``WaterfallStep``, ``WATERFALL`` (the steps), ``SERVERS``, ``lever_table`` (ratios with the
  interval over ladder and repeats, and their verdict), ``lever_sentence``, ``floor_model``; the steps are climbed
  and their knees read with ``course_lib.measure.ladder`` (``climb``, ``knees``, ``geometric_ladder``,
  ``start_rungs``; a rung's length is ``course_lib.measure.loadgen.rung_duration_s``, re-exported here with
  ``MIN_REQUESTS_P99``);
* ``_record``: ``save_waterfall`` / ``load_waterfall`` (``data/measurements/service_waterfall.json``);
* ``_bench``: ``run_waterfall`` (servers, ``Server-Timing`` ceilings, knees, a like-for-like p99);
* ``_tools``: ``tool_comparison`` (k6 beside the course generator, taking turns, repeated) and
  ``tool_agreement`` (their knees and p50s);
* ``_spin``: ``spin_comparison`` / ``spin_table`` / ``spin_verdict`` (the course generator with and without its spin beside k6,
  below the knee), ``save_tool_wire_p50`` / ``load_tool_wire_p50`` (``data/measurements/tool_wire_p50.json``);
* ``_peers``: ``PEERS`` (BentoML, LitServe, granian on the same work) and ``save_peers`` / ``load_peers``.

``benchmarks/service_waterfall.py`` and ``benchmarks/serving_peers.py`` record the full runs; Lessons 5,
6 and 12 read them, and Lessons 6 and 12 run short versions. k6 itself, Locust and each load tool's CPU
per request are ``course_lib.measure.load_tools``.
"""

from __future__ import annotations

from course_lib.measure.loadgen import MIN_REQUESTS_P99, rung_duration_s
from course_lib.measure.waterfall._bench import WaterfallRun, in_process_ceiling, run_waterfall
from course_lib.measure.waterfall._peers import (
    PEERS,
    PEERS_VENV,
    RECORDED_PEERS,
    PeerSpec,
    PeersRecord,
    load_peers,
    peer_command,
    save_peers,
)
from course_lib.measure.waterfall._record import (
    RECORDED_WATERFALL,
    WaterfallRecord,
    load_waterfall,
    save_waterfall,
)
from course_lib.measure.waterfall._spin import (
    RECORDED_TOOL_WIRE_P50,
    ToolWireP50Record,
    load_tool_wire_p50,
    save_tool_wire_p50,
    spin_comparison,
    spin_table,
    spin_verdict,
)
from course_lib.measure.waterfall._steps import (
    FLOOR_STEP,
    PRODUCTION_STEP,
    PROTOTYPE_STEP,
    SERVERS,
    WATERFALL,
    WaterfallStep,
    floor_model,
    lever_sentence,
    lever_table,
)
from course_lib.measure.waterfall._tools import (
    AGREEMENT_TOLERANCE,
    TOOLS,
    tool_agreement,
    tool_comparison,
)

__all__ = [
    "AGREEMENT_TOLERANCE",
    "FLOOR_STEP",
    "MIN_REQUESTS_P99",
    "PEERS",
    "PEERS_VENV",
    "PRODUCTION_STEP",
    "PROTOTYPE_STEP",
    "RECORDED_PEERS",
    "RECORDED_TOOL_WIRE_P50",
    "RECORDED_WATERFALL",
    "SERVERS",
    "TOOLS",
    "WATERFALL",
    "PeerSpec",
    "PeersRecord",
    "ToolWireP50Record",
    "WaterfallRecord",
    "WaterfallRun",
    "WaterfallStep",
    "floor_model",
    "in_process_ceiling",
    "lever_sentence",
    "lever_table",
    "load_peers",
    "load_tool_wire_p50",
    "load_waterfall",
    "peer_command",
    "run_waterfall",
    "rung_duration_s",
    "save_peers",
    "save_tool_wire_p50",
    "save_waterfall",
    "spin_comparison",
    "spin_table",
    "spin_verdict",
    "tool_agreement",
    "tool_comparison",
]
