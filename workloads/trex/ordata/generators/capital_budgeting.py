"""Capital budgeting (MILP): select projects maximising NPV under per-period budgets."""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, cons, make_instance, param, pick, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("utility", "Utility capital plan",
           "A water utility selects infrastructure projects for the next two years to maximise net present value "
           "within each year's capital budget.", {"money": "million dollars"},
           {"project": ("Pipe renewal", "New reservoir", "Smart meters", "Treatment upgrade", "Pump station",
                        "Leak detection", "Desalination pilot", "SCADA refresh", "Sewer relining", "Solar farm")}),
    Domain("city", "Municipal investment",
           "A city council chooses public projects to fund over two budget years to maximise social net value.",
           {"money": "million euros"},
           {"project": ("Bike lanes", "School roof", "Library wing", "Tram extension", "Park renewal",
                        "LED streetlights", "Clinic", "Flood barrier", "Bridge repair", "Sports hall")}),
    Domain("telecom", "Network investment",
           "A telecom operator picks network investments for the next two years to maximise NPV under capital "
           "limits.", {"money": "million dollars"},
           {"project": ("5G rollout", "Fibre backbone", "Core upgrade", "Data centre", "Tower sharing",
                        "Rural coverage", "Billing system", "Edge compute", "Subsea cable", "IoT platform")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """``size`` + 2 projects, 2 periods; budgets 35-65% of the total outlay of each period."""
    projects = pick(rng, dom.names["project"], size + 2)
    periods = ["Year 1", "Year 2"]
    m = dom.words["money"]
    npv = [float(rng.integers(5, 80)) for _ in projects]
    outlay = [[float(rng.integers(2, 40)) for _ in projects] for _ in periods]
    budget = [float(int(sum(row) * rng.uniform(0.35, 0.65))) for row in outlay]
    x = {p: f"fund_{slug(p)}" for p in projects}
    variables = [Variable(x[p], "binary", 0.0, 1.0, "", f"1 if {p} is funded") for p in projects]
    constraints = [cons(f"budget_{slug(t)}", {x[p]: outlay[k][i] for i, p in enumerate(projects)}, "<=", budget[k],
                        "budget") for k, t in enumerate(periods)]
    params = [
        param("npv", npv, ["projects"], m, f"net present value ({m})", f"<e> has a net present value of <v> {m}."),
        param("outlay", outlay, ["periods", "projects"], m, f"capital outlay ({m})", f"<f> needs <v> {m} in <e>."),
        param("budget", budget, ["periods"], m, f"capital budget ({m})", f"The budget for <e> is <v> {m}."),
    ]
    obj = Objective("max", {x[p]: npv[i] for i, p in enumerate(projects)}, description="total NPV")
    notes = {"objective": f"Maximise the total net present value in {m}.",
             "rules": "Projects are all-or-nothing; a funded project incurs its outlays in both years."}
    return make_instance("capital_budgeting", dom, seed, {"projects": projects, "periods": periods}, params, variables,
                         constraints, obj, notes)


FAMILY = Family("capital_budgeting", "MILP", DOMAINS, build)
