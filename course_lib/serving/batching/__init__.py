"""Online (dynamic) batching: Triton's batching rule, the asyncio batcher, and ``POST /predict`` through it.

* :mod:`~course_lib.serving.batching.rule`: Triton's dynamic-batching rule (max batch size, max queue
  delay, preferred batch sizes), shared by the simulator, the batcher and the load generator;
* :mod:`~course_lib.serving.batching.core`: ``CoreBatcher``, the batcher's idea in about 40 lines
  (queue, rule, one call, futures), which Lesson 3 reads;
* :mod:`~course_lib.serving.batching.batcher`: the asyncio ``DynamicBatcher`` (its bounded queue and
  per-request results are private modules);
* :mod:`~course_lib.serving.batching.predict`: the churn app with ``POST /predict`` through the batcher.

Offline batch scoring is :mod:`course_lib.offline`.
"""

__all__ = ["batcher", "core", "predict", "rule"]
