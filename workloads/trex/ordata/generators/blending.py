"""Blending (LP): mix raw materials into a fixed batch meeting quality bounds at least cost."""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, cons, make_instance, param, pick, r, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("alloy", "Alloy blending",
           "A foundry melts a batch of alloy from several scrap and ore sources and must hit the specification "
           "on its element contents at the lowest material cost.",
           {"q": "tonnes", "money": "dollars", "batch": "batch of alloy"},
           {"raw": ("Steel scrap", "Pig iron", "Ferro-chrome", "Nickel scrap", "Stainless scrap", "Cast iron scrap"),
            "quality": ("chromium (%)", "carbon (%)", "nickel (%)")}),
    Domain("fuel", "Gasoline blending",
           "A refinery blends gasoline components into a finished batch that must meet octane and vapour "
           "pressure specifications at least cost.",
           {"q": "barrels", "money": "dollars", "batch": "batch of gasoline"},
           {"raw": ("Reformate", "Alkylate", "FCC naphtha", "Butane", "Isomerate", "Straight-run naphtha"),
            "quality": ("octane number", "vapour pressure (psi)", "sulphur (ppm)")}),
    Domain("fertiliser", "Fertiliser mixing",
           "A fertiliser plant mixes ingredients into a bagged product whose nutrient contents must lie within "
           "the label's limits, at the lowest ingredient cost.",
           {"q": "kg", "money": "euros", "batch": "batch of fertiliser"},
           {"raw": ("Urea", "Ammonium nitrate", "Superphosphate", "Potash", "Compost", "Bone meal"),
            "quality": ("nitrogen (%)", "phosphorus (%)", "potassium (%)")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """``size`` raw materials, 2 quality attributes with bounds around a random feasible mix."""
    raws = pick(rng, dom.names["raw"], size)
    quals = pick(rng, dom.names["quality"], 2)
    q, m = dom.words["q"], dom.words["money"]
    batch = float(rng.integers(50, 200))
    attr = [[float(rng.integers(1, 60)) for _ in raws] for _ in quals]
    cost = [r(rng.uniform(10, 90), 1) for _ in raws]
    mix = rng.dirichlet(np.ones(size))
    avail = [float(int(np.ceil(mix[i] * batch * rng.uniform(1.2, 2.0))) + 1) for i in range(size)]
    avg = [float(np.dot(attr[k], mix)) for k in range(2)]
    lo = [float(np.floor(avg[k] * rng.uniform(0.8, 0.95))) for k in range(2)]
    hi = [float(np.ceil(avg[k] * rng.uniform(1.05, 1.2))) for k in range(2)]
    x = {s: f"use_{slug(s)}" for s in raws}
    variables = [Variable(x[s], "continuous", 0.0, avail[i], q, f"{q} of {s} in the batch") for i, s in enumerate(raws)]
    constraints = [cons("batch_size", {x[s]: 1.0 for s in raws}, "==", batch, "batch", "total batch size")]
    for k, a in enumerate(quals):
        constraints.append(cons(f"min_{slug(a)}", {x[s]: attr[k][i] - lo[k] for i, s in enumerate(raws)}, ">=", 0.0,
                                "quality", f"average {a} at least its minimum"))
        constraints.append(cons(f"max_{slug(a)}", {x[s]: attr[k][i] - hi[k] for i, s in enumerate(raws)}, "<=", 0.0,
                                "quality", f"average {a} at most its maximum"))
    params = [
        param("batch", batch, [], q, f"batch size ({q})", f"The {dom.words['batch']} must weigh exactly <v> {q}."),
        param("cost", cost, ["raws"], f"{m}/{q}", f"cost per unit ({m})", f"<e> costs <v> {m} per unit."),
        param("available", avail, ["raws"], q, f"availability ({q})", f"At most <v> {q} of <e> are available."),
        param("attribute", attr, ["qualities", "raws"], "", "attribute value", "<f> has a <e> value of <v>."),
        param("min_quality", lo, ["qualities"], "", "minimum blend average", "The blend's average <e> must be at least <v>."),
        param("max_quality", hi, ["qualities"], "", "maximum blend average", "The blend's average <e> must be at most <v>."),
    ]
    obj = Objective("min", {x[s]: cost[i] for i, s in enumerate(raws)}, description="total material cost")
    notes = {"objective": f"Minimise the total material cost in {m}.",
             "rules": "Attributes blend linearly in proportion to quantity."}
    return make_instance("blending", dom, seed, {"raws": raws, "qualities": quals}, params, variables, constraints,
                         obj, notes)


FAMILY = Family("blending", "LP", DOMAINS, build)
