"""Portfolio (QP): Markowitz minimum-variance allocation with a required expected return."""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, Infeasible, cons, make_instance, param, pick, r, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("equities", "Equity portfolio",
           "An asset manager splits a fund across stocks to minimise the variance of its return while reaching "
           "a target expected return.",
           {"what": "stocks"},
           {"asset": ("Northwind", "Contoso", "Fabrikam", "Tailspin", "Litware", "Adatum", "Woodgrove", "Proseware")}),
    Domain("pension", "Pension fund allocation",
           "A pension fund allocates its capital across asset classes, minimising risk (variance) subject to a "
           "minimum expected return.",
           {"what": "asset classes"},
           {"asset": ("Government bonds", "Corporate bonds", "Domestic equity", "Global equity", "Real estate",
                      "Infrastructure", "Commodities")}),
    Domain("crypto", "Digital-asset treasury",
           "A company's treasury spreads its reserve over digital assets and cash equivalents, minimising variance "
           "for a required expected return.",
           {"what": "assets"},
           {"asset": ("Token A", "Token B", "Stablecoin pool", "Treasury bills", "Token C", "Token D")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """``size`` assets; covariance = factor model + diagonal (positive definite after rounding)."""
    assets = pick(rng, dom.names["asset"], size)
    n = size
    ret = [r(rng.uniform(0.01, 0.15), 3) for _ in assets]
    f = rng.normal(0, 0.08, size=(n, 2))
    cov = f @ f.T + np.diag(rng.uniform(0.002, 0.02, size=n))
    cov = np.round(cov, 4)
    cov = (cov + cov.T) / 2
    if np.linalg.eigvalsh(cov).min() <= 1e-6:
        raise Infeasible("covariance matrix is not positive definite after rounding")
    cap = r(max(0.4, 1.5 / n), 2)
    target = r(min(ret) + (max(ret) - min(ret)) * rng.uniform(0.2, 0.6), 3)
    # Reachability: the best return with weights <= cap must exceed the target.
    srt, best, left = sorted(ret, reverse=True), 0.0, 1.0
    for v in srt:
        w = min(cap, left)
        best += w * v
        left -= w
    if best < target or left > 1e-9:
        raise Infeasible("target return is not reachable within the weight cap")
    x = {a: f"w_{slug(a)}" for a in assets}
    variables = [Variable(x[a], "continuous", 0.0, cap, "fraction", f"share of the fund in {a}") for a in assets]
    constraints = [
        cons("budget", {x[a]: 1.0 for a in assets}, "==", 1.0, "budget", "the whole fund is invested"),
        cons("target_return", {x[a]: ret[i] for i, a in enumerate(assets)}, ">=", target, "return",
             "expected return at least the target"),
    ]
    quad = []
    for i in range(n):
        for j in range(i, n):
            c = float(cov[i, j]) * (1.0 if i == j else 2.0)
            if c != 0:
                quad.append((x[assets[i]], x[assets[j]], c))
    params = [
        param("expected_return", ret, ["assets"], "fraction per year", "expected annual return",
              "<e> has an expected annual return of <v>."),
        param("covariance", [[float(v) for v in row] for row in cov], ["assets", "assets"], "", "return covariance",
              "The covariance of the returns of <e> and <f> is <v>."),
        param("target", target, [], "fraction per year", "required expected return",
              "The portfolio's expected return must be at least <v>."),
        param("max_weight", cap, [], "fraction", "largest share per holding",
              "No single holding may exceed a share of <v> of the fund."),
    ]
    obj = Objective("min", {}, quadratic=tuple(quad), description="portfolio variance")
    notes = {"objective": "Minimise the variance of the portfolio return.",
             "rules": "Shares are fractions of the fund, non-negative (no short selling) and sum to 1. "
                      "Returns are expressed as fractions (0.05 means 5%)."}
    return make_instance("portfolio", dom, seed, {"assets": assets}, params, variables, constraints, obj, notes)


FAMILY = Family("portfolio", "QP", DOMAINS, build)
