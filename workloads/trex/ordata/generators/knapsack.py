"""Knapsack (MILP): pick items of maximum value within a weight capacity."""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, cons, make_instance, param, pick, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("cargo", "Cargo loading",
           "An air-freight forwarder chooses which consignments to load onto a flight to maximise revenue within "
           "the aircraft's payload.", {"w": "kg", "v": "dollars", "cap": "payload"},
           {"item": ("Medical kits", "Auto parts", "Textiles", "Electronics", "Flowers", "Machinery", "Documents",
                     "Seafood", "Pharmaceuticals", "Art crate", "Spare engines", "Books")}),
    Domain("projects", "R&D project selection",
           "An R&D department picks projects for next year to maximise expected value within its engineering "
           "hours.", {"w": "engineer-hours", "v": "thousand dollars", "cap": "engineering budget"},
           {"item": ("Battery upgrade", "UI redesign", "Sensor fusion", "Cost-down", "New API", "Security audit",
                     "Cloud migration", "Data platform", "Mobile app", "Analytics", "Localization", "Recycling")}),
    Domain("hiking", "Expedition packing",
           "A mountaineer packs gear and wants the most useful selection that fits the weight limit.",
           {"w": "grams", "v": "utility points", "cap": "weight limit"},
           {"item": ("Stove", "Tent", "Rope", "Camera", "First-aid kit", "Water filter", "Down jacket", "GPS",
                     "Crampons", "Book", "Solar panel", "Spare socks")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """2 * ``size`` items; capacity between 30% and 60% of the total weight."""
    items = pick(rng, dom.names["item"], 2 * size)
    wt = [float(rng.integers(5, 60)) for _ in items]
    val = [float(rng.integers(10, 100)) for _ in items]
    cap = float(int(sum(wt) * rng.uniform(0.3, 0.6)))
    x = {it: f"take_{slug(it)}" for it in items}
    variables = [Variable(x[it], "binary", 0.0, 1.0, "", f"1 if {it} is selected") for it in items]
    constraints = [cons("capacity", {x[it]: wt[i] for i, it in enumerate(items)}, "<=", cap, "capacity")]
    w, v = dom.words["w"], dom.words["v"]
    params = [
        param("weight", wt, ["items"], w, f"weight ({w})", f"<e> weighs <v> {w}."),
        param("value", val, ["items"], v, f"value ({v})", f"<e> is worth <v> {v}."),
        param("capacity", cap, [], w, f"{dom.words['cap']} ({w})", f"The {dom.words['cap']} is <v> {w}."),
    ]
    obj = Objective("max", {x[it]: val[i] for i, it in enumerate(items)}, description="total value")
    notes = {"objective": f"Maximise the total value in {v}.",
             "rules": "Each item is either taken whole or left behind."}
    return make_instance("knapsack", dom, seed, {"items": items}, params, variables, constraints, obj, notes)


FAMILY = Family("knapsack", "MILP", DOMAINS, build)
