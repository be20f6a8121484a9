"""The grader's checks of ps4, the capstone (instructors only: hidden customers, the rules and answers).

The expected answers come from the reference kernel: a sandboxed kernel that runs only
``REFERENCE_SETUP`` (the course's model, the slow baseline and its feature store), never student
code. The speed checks time both kernels from the grader's side (``course_lib.grading.checks.speedup``).
"""

import numpy as np

from course_lib.grading.checks import Checks, is_float, speedup
from course_lib.grading.wire import Records

REFERENCE_SETUP = """
import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from course_lib.churn.model import labels, load_or_train_churn_model
from course_lib.optimize.accuracy_budget import AccuracyBudget, budget_verdicts, slice_auc_drops
from course_lib.serving.slow_baseline import SlowChurnScorer

model = load_or_train_churn_model()
baseline = SlowChurnScorer.open(model=model)
store = baseline.store
SPLITS = {"test": model.split.test, "valid": model.split.valid}


def rows(split):
    return SPLITS[split].to_dict("records")


def sample_ids(n, seed):
    return [str(c) for c in store.sample_ids(n, seed=seed)]


def records(ids):
    return [store.get(c) for c in ids]


def full_scans(ids):
    return [store.get(c, use_index=False) for c in ids]


def baseline_scores(ids):
    return [baseline.score(c) for c in ids]


def reference_p(ids):
    return model.predict_proba(pd.DataFrame(records(ids))).astype(float)


def verdict(split, p, max_slice_auc_drop, max_log_loss_increase):
    frame = SPLITS[split]
    budget = AccuracyBudget(max_slice_auc_drop=max_slice_auc_drop, max_log_loss_increase=max_log_loss_increase)
    found = budget_verdicts(frame, model.predict_proba(frame), {"fast": np.asarray(p, dtype=float)}, budget)
    return bool(found.loc["fast", "passes"]), str(found.loc["fast", "worst_slice"])


def auc(split, p=None):
    frame = SPLITS[split]
    return float(roc_auc_score(labels(frame), model.predict_proba(frame) if p is None else np.asarray(p, float)))


def worst_slice_drop(split, p):
    frame = SPLITS[split]
    return float(slice_auc_drops(frame, model.predict_proba(frame), {"last": np.asarray(p, float)})["last"].max())
"""

CHECKS = Checks("ps4", reference_setup=REFERENCE_SETUP)

STAGES = ("lookup", "load_model", "to_frame", "predict", "log")
CEILING_SLICE_AUC_DROP = 0.02
CEILING_LOG_LOSS_INCREASE = 0.02
CEILING_ABS_PROBABILITY_DIFF = 0.25
#: Question 6's rule: fast_scorer's p99 at least this many times below the baseline's.
MIN_SPEEDUP = 3.0
#: Question 2's rule: lookup_features at least this many times faster than the full scan.
MIN_LOOKUP_SPEEDUP = 3.0
#: Calls per timed request (question 2's lookups, question 6's scores): a request's time is then mostly
#: the calls' and little the round trip between the grader and the kernel, a few milliseconds that a
#: busy machine stretches.
CALLS_PER_REQUEST = 5
SCORE_ALL = "def check(ns, ids):\n    score = ns['fast_scorer']\n    return [score(c) for c in ids]"
UNKNOWN = ("SC-9999999", "SC-0")


def requests_of(ids: list) -> list[list]:
    """``ids`` in requests of CALLS_PER_REQUEST customers each."""
    return [ids[i : i + CALLS_PER_REQUEST] for i in range(0, len(ids), CALLS_PER_REQUEST)]


def declared_diff(q) -> float:
    diff = q.value("float(MAX_ABS_PROBABILITY_DIFF)")
    q.expect(
        is_float(diff) and 0 < diff <= CEILING_ABS_PROBABILITY_DIFF, f"MAX_ABS_PROBABILITY_DIFF = {diff!r}"
    )
    return diff


def same_record(got, expected) -> bool:
    """Equal feature dicts (NaN equal to NaN)."""
    if not (isinstance(got, dict) and got.keys() == expected.keys()):
        return False
    for key, value in expected.items():
        other = got[key]
        if isinstance(value, float) and np.isnan(value):
            if not (isinstance(other, float) and np.isnan(other)):
                return False
        elif type(other) is not type(value) or other != value:
            return False
    return True


@CHECKS.question("q1")
def q1(q):
    with q.step("the baseline's profile and DOMINANT_STAGE"):
        stage = q.value("DOMINANT_STAGE")
        profile = q.value(
            "{'type': type(baseline_profile).__name__, 'n': len(baseline_profile), "
            "'stages': sorted(baseline_profile.stage_names), 'means': {str(k): float(v) for k, v in "
            "baseline_profile.summary().drop(index=__import__('course_lib.serving.profiling', "
            "fromlist=['END_TO_END']).END_TO_END)['mean_ms'].items()}}"
        )
        q.expect(isinstance(profile, dict) and profile.get("type") == "LatencyBudget", f"got {profile!r}")
        q.expect(type(profile["n"]) is int and profile["n"] >= 20, "profile at least 20 requests")
        q.expect(profile["stages"] == sorted(STAGES), f"stages {profile['stages']}")
        means = profile["means"]
        q.expect(
            set(means) == set(STAGES) and max(means, key=means.get) == stage, "the profile's own largest mean"
        )
        q.expect(stage == "lookup", f"DOMINANT_STAGE = {stage!r}")


@CHECKS.question("q2")
def q2(q):
    reference = q.reference
    ids = reference.call("sample_ids", 25, 424242)
    expected = reference.call("full_scans", ids)
    with q.step("lookup_features on customers you have not seen"):
        for cid, record in zip(ids, expected, strict=True):
            got = q.call("lookup_features", cid)
            q.expect(same_record(got, record), f"{cid}: got {got!r}")
        for cid in UNKNOWN:
            got = q.call("lookup_features", cid)
            q.expect(got is None, f"{cid}: got {got!r}")
    with q.step(f"lookup_features at least {MIN_LOOKUP_SPEEDUP:g}x faster than the full scan"):
        batches = requests_of(reference.call("sample_ids", CALLS_PER_REQUEST * 7, 4242))
        run = "def check(ns, ids):\n    lookup = ns['lookup_features']\n    return [lookup(c) for c in ids]"
        result, pairs = speedup(
            q, student=run, baseline="full_scans", inputs=batches, rounds=3, calls_per_round=2, warmup_calls=1
        )
        q.note(f"lookup speed-up {result.ratio:.1f}x (rounds {result.low:.1f}-{result.high:.1f})")
        for got, scanned in pairs:
            q.expect(isinstance(got, list) and all(map(same_record, got, scanned)), "timed lookups agree")
        q.expect(result.ratio >= MIN_LOOKUP_SPEEDUP, f"{result.ratio:.1f}x")


def budget_of(q):
    found = q.value(
        "[type(BUDGET).__name__, float(BUDGET.max_slice_auc_drop), float(BUDGET.max_log_loss_increase)]"
    )
    q.expect(isinstance(found, list) and found[0] == "AccuracyBudget", f"BUDGET: {found!r}")
    q.expect(0 < found[1] <= CEILING_SLICE_AUC_DROP and 0 < found[2] <= CEILING_LOG_LOSS_INCREASE, f"{found}")
    return found[1], found[2]


def fast_probabilities(q, rows, n):
    """fast_predict_proba of ``rows``: ``n`` probabilities, checked here before the reference kernel
    sees them (its metrics raise on a value outside [0, 1], which would stop the whole submission)."""
    got = q.call("fast_predict_proba", Records(rows))
    q.expect(
        type(got) is np.ndarray and got.shape == (n,) and np.isfinite(got.astype(float)).all(), f"{got!r}"
    )
    p = got.astype(float)
    q.expect(bool(((p >= 0.0) & (p <= 1.0)).all()), f"values outside [0, 1]: {p.min():g} to {p.max():g}")
    return p


@CHECKS.question("q3")
def q3(q):
    reference = q.reference
    with q.step("BUDGET and MAX_ABS_PROBABILITY_DIFF within the course's ceilings"):
        budget = budget_of(q)
        declared_diff(q)
    for split in ("test", "valid"):
        rows = reference.call("rows", split)
        with q.step(f"fast_predict_proba within your budget on every slice ({split} customers)"):
            p = fast_probabilities(q, rows, len(rows))
            passes, worst = reference.call("verdict", split, p, *budget)
            q.expect(passes is True, f"over the budget on {worst}")


@CHECKS.question("q4")
def q4(q):
    reference = q.reference
    diff = declared_diff(q)
    ids = reference.call("sample_ids", 40, 20261130)
    expected = reference.call("reference_p", ids)
    with q.step("fast_scorer against the baseline on customers you have not seen"):
        got = [q.call("fast_scorer", cid) for cid in ids]
        q.expect(all(is_float(p) for p in got), "fast_scorer returns a float")
        worst = float(np.max(np.abs(np.array(got) - expected)))
        q.expect(worst <= diff, f"worst difference {worst:.4f} > {diff}")
    with q.step("fast_scorer agrees with fast_predict_proba"):
        batch = fast_probabilities(q, reference.call("records", ids), len(ids))
        q.expect(np.allclose(np.array(got), batch, atol=1e-5), "fast_scorer and fast_predict_proba differ")
    with q.step("fast_scorer of an unknown customer"):
        for cid in UNKNOWN:
            q.raises("KeyError", "fast_scorer", cid)


@CHECKS.question("q5")
def q5(q):
    reference = q.reference
    with q.step("the results table"):
        results = q.value("results")
        columns = ["p50_ms", "p99_ms", "rps", "roc_auc", "worst_slice_drop"]
        q.expect(list(results.columns) == columns, f"columns {list(results.columns)}")
        q.expect(len(results) >= 3 and results.index[0] == "baseline", f"index {list(results.index)}")
        table = results.astype(float)
        q.expect((table["p50_ms"] <= table["p99_ms"]).all() and (table["rps"] > 0).all())
        q.expect(table["roc_auc"].between(0.5, 1.0).all())
    with q.step("the results table's first and last rows against your models"):
        rows = reference.call("rows", "test")
        p_fast = fast_probabilities(q, rows, len(rows))
        q.expect(abs(table["worst_slice_drop"].iloc[0]) < 1e-12, "the baseline loses nothing against itself")
        q.expect(abs(table["roc_auc"].iloc[0] - reference.call("auc", "test")) < 1e-6, "baseline ROC AUC")
        q.expect(
            abs(table["roc_auc"].iloc[-1] - reference.call("auc", "test", p_fast)) < 1e-6, "last ROC AUC"
        )
        worst = reference.call("worst_slice_drop", "test", p_fast)
        q.expect(
            abs(table["worst_slice_drop"].iloc[-1] - worst) < 1e-9, "the last step is fast_scorer's model"
        )


@CHECKS.question("q6")
def q6(q):
    diff = declared_diff(q)
    batches = requests_of(q.reference.call("sample_ids", CALLS_PER_REQUEST * 10, 99))
    with q.step(f"fast_scorer's p99 at least {MIN_SPEEDUP:g}x below the baseline's, timed by the grader"):
        result, pairs = speedup(
            q,
            student=SCORE_ALL,
            baseline="baseline_scores",
            inputs=batches,
            rounds=3,
            calls_per_round=3,
            warmup_calls=1,
        )
        q.note(f"p99 speed-up {result.ratio:.2f}x (rounds {result.low:.1f}-{result.high:.1f})")
        for got, reference in pairs:
            q.expect(isinstance(got, list) and len(got) == len(reference), f"got {got!r}")
            q.expect(
                all(is_float(p) and abs(p - r) <= diff for p, r in zip(got, reference, strict=True)), f"{got}"
            )
        q.expect(result.ratio >= MIN_SPEEDUP, f"{result.ratio:.2f}x")
