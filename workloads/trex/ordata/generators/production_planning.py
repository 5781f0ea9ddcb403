"""Production planning (LP): choose output quantities that maximise profit within resource capacities."""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, cons, make_instance, param, pick, r, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("furniture", "Furniture workshop",
           "A furniture workshop decides how many units of each product to build this week to maximise profit.",
           {"unit": "units", "money": "dollars"},
           {"product": ("Chair", "Table", "Bookshelf", "Desk", "Cabinet", "Stool", "Bench"),
            "resource": ("carpentry hours", "finishing hours", "wood (board feet)", "packaging hours")}),
    Domain("bakery", "Industrial bakery",
           "An industrial bakery plans tomorrow's production batches to maximise its contribution margin.",
           {"unit": "batches", "money": "euros"},
           {"product": ("Sourdough", "Baguette", "Croissant", "Rye loaf", "Brioche", "Bagel", "Muffin"),
            "resource": ("oven hours", "flour (kg)", "labour hours", "butter (kg)")}),
    Domain("electronics", "Electronics assembly",
           "An electronics plant chooses how many units of each device to assemble this month to maximise profit.",
           {"unit": "units", "money": "dollars"},
           {"product": ("Router", "Smart plug", "Thermostat", "Doorbell camera", "Speaker", "Sensor hub"),
            "resource": ("SMT line hours", "test bench hours", "chipsets", "assembly hours")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """``size`` products, 3 resources, demand caps per product."""
    prods = pick(rng, dom.names["product"], size)
    res = pick(rng, dom.names["resource"], 3)
    u, m = dom.words["unit"], dom.words["money"]
    profit = [r(rng.uniform(5, 60), 1) for _ in prods]
    use = [[float(rng.integers(1, 9)) for _ in prods] for _ in res]
    demand = [float(rng.integers(10, 60)) for _ in prods]
    cap = [float(int(sum(use[k][i] * demand[i] for i in range(size)) * rng.uniform(0.3, 0.7))) for k in range(3)]
    x = {p: f"make_{slug(p)}" for p in prods}
    variables = [Variable(x[p], "continuous", 0.0, demand[i], u, f"{u} of {p} produced") for i, p in enumerate(prods)]
    constraints = [cons(f"capacity_{slug(rs)}", {x[p]: use[k][i] for i, p in enumerate(prods)}, "<=", cap[k],
                        "capacity", f"available {rs}") for k, rs in enumerate(res)]
    params = [
        param("profit", profit, ["products"], f"{m}/{u}", f"profit per unit ({m})", f"Each unit of <e> earns <v> {m}."),
        param("usage", use, ["resources", "products"], "", "resource use per unit", "One unit of <f> uses <v> <e>."),
        param("capacity", cap, ["resources"], "", "available capacity", "In total <v> <e> are available."),
        param("demand", demand, ["products"], u, f"market limit ({u})", f"At most <v> {u} of <e> can be sold."),
    ]
    obj = Objective("max", {x[p]: profit[i] for i, p in enumerate(prods)}, description="total profit")
    notes = {"objective": f"Maximise the total profit in {m}.",
             "rules": "Quantities may be fractional. Production cannot exceed what the market takes."}
    return make_instance("production_planning", dom, seed, {"products": prods, "resources": res}, params, variables,
                         constraints, obj, notes)


FAMILY = Family("production_planning", "LP", DOMAINS, build)
