"""The churn service's work behind other serving frameworks, for ``benchmarks/serving_peers.py`` only.

Each module runs in the peers' own virtual environment (``.venv-peers``, ``benchmarks/requirements-peers.txt``),
never in the course's: ``bento_service`` (BentoML), ``litserve_server`` (LitServe), ``granian_app``
(the production FastAPI app under granian). All three call the same ``ProductionService`` as the
production server: the same cached lookup, feature check and ONNX Runtime session.
"""
