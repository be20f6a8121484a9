"""Shared fixtures: the real data and the course model, built once per test session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Lessons are stored with inline plots; a non-interactive MPLBACKEND (e.g. Agg) inherited by nbval's kernels
# would make every plot cell produce no output and fail strict comparison.
os.environ.pop("MPLBACKEND", None)


@pytest.fixture(scope="session")
def telco():
    from course_lib.data import load_telco

    return load_telco()


@pytest.fixture(scope="session")
def churn_model():
    """The course XGBoost pipeline, trained once (deterministic, one thread)."""
    from course_lib.model import train_churn_model

    return train_churn_model()


@pytest.fixture(scope="session")
def onnx_model(churn_model):
    from course_lib.export import pipeline_to_onnx

    return pipeline_to_onnx(churn_model.pipeline)


@pytest.fixture(scope="session")
def onnx_scorer(onnx_model):
    from course_lib.export import OnnxChurnScorer, make_session

    return OnnxChurnScorer(make_session(onnx_model))
