"""Protocol tolerance rules on edge cases, pass@k against closed form and brute force, code
extraction rules and traceback classification."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from trex.verify.extract import extract_code
from trex.verify.items import Item, parse_truth
from trex.verify.protocols import Prediction, get_protocol, judge, match_truth
from trex.verify.scoring import Execution, aggregate, classify, classify_failure, pass_at_k


def ok(protocol: str, pred: float, gt: str, status: str = "optimal") -> bool:
    return match_truth(get_protocol(protocol), status, pred, parse_truth(gt))


@pytest.mark.parametrize(("pred", "gt", "expected"), [
    (0.0, "0", True), (9.9e-7, "0", True), (1.1e-6, "0", False),          # |gt| + 1 = 1 at zero
    (-100.0, "-100", True), (-100.0001, "-100", True), (-100.0002, "-100", False),  # 1e-6 * 101 = 1.01e-4
    (100.0, "-100", False), (1e9 + 999, "1e9", True), (1e9 + 1001, "1e9", False),
    (float("nan"), "1", False), (float("inf"), "1", False),
])
def test_strict_rule(pred: float, gt: str, expected: bool) -> None:
    assert ok("strict", pred, gt) is expected
    assert ok("sirl", pred, gt) is expected  # same published formula


@pytest.mark.parametrize(("pred", "gt", "expected"), [
    (104.4, "100", True), (105.4, "100", True), (105.6, "100", False),   # round(105.6) = 106 > 5 %
    (95.0, "100", True), (94.4, "100", False), (0.4, "0", True), (0.6, "0", False),
    (-1.05e6, "-1e6", True), (-1.06e6, "-1e6", False), (2.4, "2", True), (2.6, "2", False),
])
def test_orlm_rule(pred: float, gt: str, expected: bool) -> None:
    assert ok("orlm", pred, gt) is expected


@pytest.mark.parametrize(("pred", "gt", "expected"), [
    (8350.9, "8350", True), (8351.0, "8350", False),    # rel 1.2e-4 > 1e-4 and |d| = 1 is not below 1
    (57.09, "57.0", True), (57.11, "57.0", False), (0.00005, "0", True), (0.5, "0", True), (1.0, "0", False),
    (10000.9, "10000", True), (-3.14, "-3.14159", False), (-3.1416, "-3.14159", True),
])
def test_mamo_rule(pred: float, gt: str, expected: bool) -> None:
    assert ok("mamo", pred, gt) is expected


@pytest.mark.parametrize(("pred", "gt", "expected"), [
    (3000.00009, "3000.0", True), (3000.00011, "3000.0", False), (0.0, "0.0", True), (-1e-4, "0", True),
])
def test_optibench_rule(pred: float, gt: str, expected: bool) -> None:
    assert ok("optibench", pred, gt) is expected


@pytest.mark.parametrize("protocol", ["strict", "sirl", "orlm", "mamo", "optibench"])
def test_label_rule_is_shared(protocol: str) -> None:
    for status in ("infeasible", "unbounded", "infeasible_or_unbounded", "INF_OR_UNBD"):
        assert ok(protocol, float("nan"), "No Best Solution", status)
    assert not ok(protocol, 0.0, "No Best Solution", "optimal")
    assert ok(protocol, 0.0, "infeasible", "infeasible")
    assert not ok(protocol, 0.0, "infeasible", "unbounded")
    assert not ok(protocol, 0.0, "infeasible", "infeasible_or_unbounded")
    assert not ok(protocol, 5.0, "5", "infeasible")  # a number is never matched by a status


def test_named_values_all_must_match() -> None:
    item = Item("0", "q", None, named={"Number of sled dog trips": parse_truth("0.0"),
                                       "Maximized number of fish transported": parse_truth("3000.0")})
    p = get_protocol("optibench")
    good = Prediction("optimal", 3000.0, {"number of sled-dog trips": 0.0,
                                          "Maximized number of fish transported": 3000.00005})
    assert judge(p, item, good)[0]
    missing = Prediction("optimal", 3000.0, {"Maximized number of fish transported": 3000.0})
    assert judge(p, item, missing) == (False, "value 'Number of sled dog trips' not reported")
    off = Prediction("optimal", 3000.0, {"Number of sled dog trips": 0.001,
                                         "Maximized number of fish transported": 3000.0})
    assert not judge(p, item, off)[0]
    assert not judge(p, item, Prediction("infeasible", None, {}))[0]


def test_unknown_protocol_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown protocol 'lenient'"):
        get_protocol("lenient")


def closed_form(n: int, c: int, k: int) -> float:
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


def brute_force(n: int, c: int, k: int) -> float:
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_closed_form_and_brute_force() -> None:
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                est = pass_at_k(n, c, k)
                assert est == pytest.approx(closed_form(n, c, k), abs=1e-12)
                assert est == pytest.approx(brute_force(n, c, k), abs=1e-12)
    # Large n: the product form stays finite and matches exact rational arithmetic.
    for n, c, k in [(200, 3, 10), (1000, 1, 100), (500, 250, 1), (1024, 0, 512)]:
        assert pass_at_k(n, c, k) == pytest.approx(closed_form(n, c, k), rel=1e-10, abs=1e-12)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(3, 1, 4)


def test_aggregate_pass_at_k_per_item_and_category() -> None:
    recs = []
    for item, cat, correct in [("a", "LP", [True, False, False, False]), ("b", "LP", [False] * 4),
                               ("c", "MILP", [True] * 4)]:
        recs += [{"benchmark": "x", "item_id": item, "item_category": cat,
                  "category": "correct" if ok_ else "wrong_objective"} for ok_ in correct]
    s = aggregate(recs, [1, 2])["x"]
    assert s["pass@1"] == pytest.approx((0.25 + 0 + 1) / 3)
    assert s["pass@2"] == pytest.approx((closed_form(4, 1, 2) + 0 + 1) / 3)
    assert s["by_category"]["LP"] == {"items": 2, "pass@1": pytest.approx(0.125),
                                      "pass@2": pytest.approx(closed_form(4, 1, 2) / 2)}
    assert s["by_category"]["MILP"] == {"items": 1, "pass@1": 1.0, "pass@2": 1.0}
    assert s["categories"]["correct"] == 5 and s["categories"]["wrong_objective"] == 7


@pytest.mark.parametrize(("response", "code", "rule"), [
    ("text\n```python\nprint(1)\n```\nmore\n```python\nprint(2)\n```\n", "print(2)\n", "python-fence"),
    ("```py\nx = 1\n```", "x = 1\n", "python-fence"),
    ("```python\nprint(1)\n```\nthen\n```python\nimport gurobipy\nm = (", "import gurobipy\nm = (", "unclosed-python-fence"),
    ("```\nprint(3)\n```", "print(3)\n", "plain-fence"),
    ("```json\n{\"a\": 1}\n```", None, "none"),
    ("import json\nprint(json.dumps(1))", "import json\nprint(json.dumps(1))\n", "bare-code"),
    ("The answer is 42.", None, "none"),
    ("import this is prose, not code", None, "none"),
])
def test_extraction_rules(response: str, code: str | None, rule: str) -> None:
    assert extract_code(response) == (code, rule)


@pytest.mark.parametrize(("stderr", "category"), [
    ("Traceback (most recent call last):\n  File x\nModuleNotFoundError: No module named 'pulp'\n", "import_error"),
    ("Traceback:\nAttributeError: module 'gurobipy' has no attribute 'Modle'. Did you mean: 'Model'?", "import_error"),
    ("Traceback:\nAttributeError: 'Model' object has no attribute 'addVarr'", "import_error"),
    ("Traceback:\nAttributeError: Unable to retrieve attribute 'X'. Did you mean: 'Xn'?", "solver_error"),
    ("Traceback:\ngurobipy._exception.GurobiError: Model too large for size-limited license", "solver_error"),
    ("Traceback:\nZeroDivisionError: division by zero", "runtime_error"),
    ("Traceback:\nAttributeError: 'list' object has no attribute 'foo'", "runtime_error"),
    ("Segmentation fault", "runtime_error"),
])
def test_failure_classification(stderr: str, category: str) -> None:
    assert classify_failure(stderr)[0] == category


def test_classify_order() -> None:
    item = Item("0", "q", parse_truth("10"))
    p = get_protocol("strict")
    ran = Execution(0, False, "", {"status": "optimal", "objective": 10.0, "values": {}})
    assert classify(None, None, None, p, item)[0].category == "no_code"
    assert classify("x", "SyntaxError: bad", None, p, item)[0].category == "syntax_error"
    assert classify("x", None, Execution(None, True, "", None), p, item)[0].category == "timeout"
    assert classify("x", None, Execution(None, False, "", None, signal=9), p, item)[0].category == "runtime_error"
    assert classify("x", None, ran, p, item)[0].category == "correct"
    off = Execution(0, False, "", {"status": "optimal", "objective": 10.1})
    assert classify("x", None, off, p, item)[0].category == "wrong_objective"
    odd = Execution(0, False, "", {"status": "suboptimal", "objective": 10.0})
    assert classify("x", None, odd, p, item)[0].category == "solver_error"
