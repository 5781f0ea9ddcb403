"""Diet (LP): choose amounts of foods that meet nutrient minimums at least cost."""

from __future__ import annotations

import numpy as np

from trex.ordata.generators.base import Domain, Family, Infeasible, cons, make_instance, param, pick, r, slug
from trex.ordata.ir import Instance, Objective, Variable

DOMAINS = (
    Domain("hospital", "Hospital menu planning",
           "A hospital kitchen plans the daily menu of a patient and wants the cheapest combination of foods "
           "that meets the dietitian's nutrient minimums.",
           {"amount": "servings", "money": "dollars", "who": "the kitchen"},
           {"food": ("Oatmeal", "Chicken", "Rice", "Lentils", "Yogurt", "Spinach", "Salmon", "Eggs", "Apples"),
            "nutrient": ("protein (g)", "fiber (g)", "calcium (mg)", "iron (mg)", "vitamin C (mg)")}),
    Domain("livestock", "Livestock feed mix",
           "A dairy farm mixes the daily ration of one cow from available feedstuffs and wants the cheapest "
           "ration that satisfies the herd nutritionist's requirements.",
           {"amount": "kg", "money": "dollars", "who": "the farm"},
           {"food": ("Corn silage", "Alfalfa hay", "Soybean meal", "Barley", "Cottonseed", "Wheat bran", "Beet pulp"),
            "nutrient": ("crude protein (kg)", "energy (Mcal)", "fiber (kg)", "phosphorus (g)")}),
    Domain("expedition", "Expedition rations",
           "An expedition outfitter packs food for one trekker for one day and wants the lowest-cost pack "
           "that still covers the nutritional minimums.",
           {"amount": "packs", "money": "euros", "who": "the outfitter"},
           {"food": ("Trail mix", "Jerky", "Freeze-dried pasta", "Energy bar", "Dried fruit", "Peanut butter",
                     "Instant oats"),
            "nutrient": ("calories (kcal)", "protein (g)", "carbohydrates (g)", "fat (g)")}),
)


def build(rng: np.random.Generator, size: int, dom: Domain, seed: int) -> Instance:
    """``size`` foods, 3 nutrients; requirements set at 40-70% of what the maximal servings provide."""
    foods = pick(rng, dom.names["food"], size)
    nutrients = pick(rng, dom.names["nutrient"], 3)
    a, m = dom.words["amount"], dom.words["money"]
    cost = [r(rng.uniform(0.5, 6.0)) for _ in foods]
    content = [[float(rng.integers(0, 30)) for _ in foods] for _ in nutrients]
    cap = [float(rng.integers(2, 6)) for _ in foods]
    req = []
    for k in range(len(nutrients)):
        most = sum(content[k][i] * cap[i] for i in range(len(foods)))
        if most <= 0:
            raise Infeasible(f"nutrient {nutrients[k]} is absent from every food")
        req.append(float(max(1, int(most * rng.uniform(0.4, 0.7)))))
    x = {f: f"amount_{slug(f)}" for f in foods}
    variables = [Variable(x[f], "continuous", 0.0, cap[i], a, f"{a} of {f}") for i, f in enumerate(foods)]
    constraints = [
        cons(f"min_nutrient_{k}", {x[f]: content[k][i] for i, f in enumerate(foods)}, ">=", req[k], "requirements",
             f"minimum of {nut}")
        for k, nut in enumerate(nutrients)
    ]
    params = [
        param("cost", cost, ["foods"], f"{m}/{a}", f"cost per unit ({m} per {a[:-1] if a.endswith('s') else a})",
              f"One unit of <e> costs <v> {m}."),
        param("content", content, ["nutrients", "foods"], "per unit", "nutrient content per unit",
              "One unit of <f> provides <v> of <e>."),
        param("max_amount", cap, ["foods"], a, f"most {a} allowed", f"At most <v> {a} of <e> can be used."),
        param("requirement", req, ["nutrients"], "", "daily minimum", "The plan must provide at least <v> of <e>."),
    ]
    obj = Objective("min", {x[f]: cost[i] for i, f in enumerate(foods)}, description="total cost")
    notes = {"objective": f"Minimise the total cost in {m} while meeting every nutrient minimum.",
             "rules": f"Amounts can be fractional {a}."}
    return make_instance("diet", dom, seed, {"foods": foods, "nutrients": nutrients}, params, variables,
                         constraints, obj, notes)


FAMILY = Family("diet", "LP", DOMAINS, build)
