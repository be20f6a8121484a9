"""course_lib.churn.distillation: a small student learns from the teacher's probabilities on unlabelled customers."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from course_lib.churn.data import make_customers
from course_lib.churn.distillation import student_proba, teacher_probabilities, train_student
from course_lib.churn.model import labels


@pytest.fixture(scope="module")
def population(churn_model):
    return make_customers(5_000, seed=11, source=churn_model.split.train)


def test_distilled_student_beats_chance_on_the_real_test_set(churn_model, population):
    q = teacher_probabilities(churn_model.pipeline, population)
    assert q.shape == (len(population),) and q.min() > 0 and q.max() < 1
    student = train_student(population, q, n_estimators=10)
    p = student_proba(student, churn_model.split.test)
    assert p.min() >= 0 and p.max() <= 1
    auc = roc_auc_score(labels(churn_model.split.test), p)
    assert auc > 0.75
    assert len(student.named_steps["student"].get_booster().get_dump()) == 10


def test_teacher_ignores_the_population_labels(churn_model, population):
    flipped = population.assign(churn=~population["churn"])
    np.testing.assert_array_equal(
        teacher_probabilities(churn_model.pipeline, population),
        teacher_probabilities(churn_model.pipeline, flipped),
    )


def test_student_learns_from_hard_labels_too(churn_model):
    train = churn_model.split.train
    student = train_student(train, labels(train), n_estimators=10)
    assert (
        roc_auc_score(labels(churn_model.split.test), student_proba(student, churn_model.split.test)) > 0.75
    )


def test_bad_targets_and_objective_raise(churn_model):
    train = churn_model.split.train
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        train_student(train, np.full(len(train), 1.5))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        train_student(train, np.full(len(train), np.nan))
    with pytest.raises(ValueError, match="shape"):
        train_student(train, np.zeros(3))
    with pytest.raises(ValueError, match="objective"):
        train_student(train, labels(train), objective="reg:squarederror")
