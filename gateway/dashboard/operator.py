"""The operator's view (admin sessions only): every tenant side by side over a range, the top
spenders, and the budgets closest to their limit in the current budget period."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, cast

from sqlalchemy import select

from gateway.dashboard.queries import FIELDS, budget_used, cells, fold, shown
from gateway.dashboard.ranges import Range
from gateway.db.engine import Database
from gateway.db.models import Limit, Tenant
from gateway.quotas.limits import Period
from gateway.usage.records import plain_cost

NEAR = 0.8  # a budget this much used is "near its limit"
TOP = 5
CHART_LINES = 8
OTHERS = "*"  # the chart line of every tenant beyond the busiest; no tenant id is "*"


async def overview(db: Database, rng: Range) -> dict[str, Any]:
    async with db.session() as s:
        tenants = (await s.execute(select(Tenant.id, Tenant.name, Tenant.status).order_by(Tenant.name))).all()
        limits = (await s.execute(select(Limit).where(Limit.scope == "tenant"))).scalars().all()
    names = {t.id: t.name for t in tenants}
    series, by_tenant = fold(await cells(db, rng, "tenant_id"), rng)
    rows = []
    for t in tenants:
        points = by_tenant.get(t.id, [])
        sums = {f: sum(p[f] for p in points) for f in FIELDS}
        sums["cost"] = plain_cost(sums["cost"])
        rows.append({"tenant_id": t.id, "name": t.name, "status": t.status, **sums,
                     "error_rate": sums["errors"] / sums["requests"] if sums["requests"] else 0.0})
    return {
        "start": rng.start.isoformat(),
        "end": rng.end.isoformat(),
        "bucket": rng.bucket,
        "tz": rng.tz_name,
        "series": shown(series),
        **_busiest(by_tenant, names),
        "tenants": rows,
        "top_spenders": sorted((r for r in rows if r["cost"] > 0), key=lambda r: -r["cost"])[:TOP],
        "budgets": await _budgets(db, limits, names),
    }


def _busiest(by_tenant: dict[str, list[dict[str, Any]]], names: dict[str, str]) -> dict[str, Any]:
    """Requests per bucket of the CHART_LINES busiest tenants, and of all the others as one line:
    keyed by tenant id ("" for admin keys, OTHERS for the rest) so that no name can hide another
    line, with each line's label apart."""
    ranked = sorted(by_tenant.items(), key=lambda kv: -sum(p["requests"] for p in kv[1]))
    lines = {t: [p["requests"] for p in pts] for t, pts in ranked[:CHART_LINES]}
    labels = {t: names.get(t, t or "(admin keys)") for t in lines}
    if rest := ranked[CHART_LINES:]:
        lines[OTHERS] = [sum(pts[i]["requests"] for _, pts in rest) for i in range(len(rest[0][1]))]
        labels[OTHERS] = "other tenants"
    return {"series_by_tenant": lines, "tenant_labels": labels}


async def _budgets(db: Database, limits: Any, names: dict[str, str]) -> list[dict[str, Any]]:
    """Each tenant budget with its use this period, fullest first."""
    periods: dict[str, list[Limit]] = defaultdict(list)
    for lim in limits:
        if lim.token_budget is not None or lim.cost_budget is not None:
            periods[lim.budget_period].append(lim)
    out = []
    for period, group in periods.items():
        used = await budget_used(db, [lim.scope_id for lim in group], cast(Period, period))
        for lim in group:
            tokens, cost = used.get(lim.scope_id, (0, 0.0))
            for kind, value, cap in (("tokens", tokens, lim.token_budget), ("cost", cost, lim.cost_budget)):
                if cap is None:
                    continue
                share = value / cap if cap > 0 else 1.0
                out.append({"tenant_id": lim.scope_id, "name": names.get(lim.scope_id, lim.scope_id),
                            "budget": kind, "period": period, "used": value, "limit": cap,
                            "share": round(share, 4), "near_limit": share >= NEAR})
    return sorted(out, key=lambda r: -r["share"])
