"""Layer 3, deterministic models of what the lessons measure: traffic, batching, tails, caches, fleets, HPA.

Traffic (Poisson arrivals, Zipf traces, the traffic day), Triton's dynamic batcher, the tail and
hedging, caches, a fleet under an autoscaler, the Kubernetes HPA rule, scale to zero.

Imports only from the layers below (core, churn, serving, optimize).
"""

__all__ = ["batching", "cache", "fleet", "hpa", "scale_to_zero", "tail", "traffic"]
