"""Instance generators, one module per family; :data:`FAMILIES` maps family names to them."""

from __future__ import annotations

from trex.ordata.generators import (
    assignment,
    bin_packing,
    blending,
    capital_budgeting,
    cutting_stock,
    diet,
    facility_location,
    knapsack,
    network_flow,
    portfolio,
    production_planning,
    set_covering,
    staff_scheduling,
    transportation,
    tsp,
    vrp,
)
from trex.ordata.generators.base import Family, GenerationError, derive_seed, sample_feasible

FAMILIES: dict[str, Family] = {
    m.FAMILY.name: m.FAMILY
    for m in (diet, production_planning, staff_scheduling, transportation, blending, network_flow, portfolio,
              cutting_stock, knapsack, assignment, facility_location, capital_budgeting, set_covering, bin_packing,
              tsp, vrp)
}

__all__ = ["FAMILIES", "Family", "GenerationError", "derive_seed", "sample_feasible"]
