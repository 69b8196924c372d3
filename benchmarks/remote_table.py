"""The tables of benchmarks/remote.py: one per server x latency, with the issue's targets."""

from __future__ import annotations

from typing import Any

TARGET_X = {"sequential": 0.8, "windowed": 0.7, "global": 0.5}
CEILING = {"sequential": "whole_8", "windowed": "whole_8", "global": "range_64"}
MIN_GLOBAL_RATE = 1200.0
MAX_FIRST_S = 2.0
MAX_EPOCH_X = 2.0  # an epoch's bytes / the dataset's
TARGET_LATENCY_MS = 50.0


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def ceiling_rate(cell: dict[str, Any], n: int, which: str) -> float | None:
    """A ceiling in elements per second (whole files: n over the time; ranges: GETs/s)."""
    c = cell["ceilings"].get(which, {})
    if "error" in c or not c:
        return None
    if which == "whole_8":
        return float(n / c["seconds"])
    return float(c["per_s"])


def misses(
    r: dict[str, Any], kind: str, x: float | None, n: int, data: int, mosaic: float | None
) -> list[str]:
    """The targets at +50 ms this row misses (empty: it meets them all)."""
    out = []
    if x is None or x < TARGET_X[kind]:
        out.append(f"x<{TARGET_X[kind]}")
    if kind == "global" and (r["el_s"] or 0) < MIN_GLOBAL_RATE:
        out.append(f"<{MIN_GLOBAL_RATE:.0f}/s")
    if kind == "windowed" and mosaic is not None and (r["el_s"] or 0) < mosaic:
        out.append("<mosaic")
    if r["first_s"] is None or r["first_s"] >= MAX_FIRST_S:
        out.append("first")
    if r["epoch_bytes"] > MAX_EPOCH_X * data:
        out.append("MB")
    if kind == "windowed" and r["epoch_requests"] > n / 5:
        out.append("req>n/5")
    return out


def _mosaic_rate(cell: dict[str, Any]) -> float | None:
    for p in cell.get("peers", []):
        if p["name"] == "mosaic" and p.get("el_s"):
            return float(p["el_s"])
    return None


def local_rate(report: dict[str, Any], name: str) -> float | None:
    """The el/s row ``name`` reached on local disk (:func:`print_local`), or None."""
    r = (report.get("local") or {}).get(name, {})
    return None if "error" in r or not r.get("el_s") else float(r["el_s"])


def print_local(report: dict[str, Any]) -> None:
    """The rows read from local disk, and the DataLoader floor: what each reader allows here."""
    print(
        "\n### local disk: the same files, no network, no cache (the rate each reader "
        "allows on this machine)"
    )
    print("\n| read | el/s | first batch s |")
    print("|---|---:|---:|")
    for name, r in report["local"].items():
        if "error" in r:
            print(f"| {name} | failed: {r['error']} | |")
            continue
        print(f"| {name} | {_f(r['el_s'], ',.0f')} | {_f(r['first_s'], '.2f')} |")
    print(
        f"\n(the median of {report.get('repeats', 1)} epochs; the remote tables' "
        '"x local" is a row\'s el/s over its own here)',
        flush=True,
    )


def print_cell(cell: dict[str, Any], report: dict[str, Any]) -> None:
    n, data = report["n"], report["dataset_bytes"]
    lat = cell["latency_ms"]
    print(f"\n### {cell['server']}, +{lat:g} ms ({n} elements, {data / 1e6:.1f} MB)")
    c = cell["ceilings"]
    parts = []
    for which, label in (
        ("whole_8", "shard files whole, 8 at a time"),
        ("range_64", "range GETs, 64 in flight"),
        ("range_256", "256 in flight"),
    ):
        if "error" in c.get(which, {"error": "-"}):
            parts.append(f"{label}: {c.get(which, {}).get('error', '-')}")
            continue
        rate = ceiling_rate(cell, n, which)
        mb = c[which]["bytes"] / c[which]["seconds"] / 1e6
        parts.append(f"{label}: {_f(rate, ',.0f')} el/s ({mb:.1f} MB/s)")
    print("ceilings, plain clients through this proxy: " + "; ".join(parts))
    at_target = lat == TARGET_LATENCY_MS
    mosaic = _mosaic_rate(cell)
    print(
        f"\n| read | cache (limit {report['cache_limit'] / 1e6:.1f} MB) | el/s | x ceiling | x local "
        "| first batch s | MB/epoch (x data) | requests/epoch (x n) | @50ms |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for r in cell["rows"]:
        cache = "yes" if r["cache"] else "no"
        if r.get("cache_peak") is not None:
            cache += f", peak {r['cache_peak'] / 1e6:.1f} MB"
        if "error" in r:
            print(f"| {r['name']} | {cache} | refused/failed: {r['error']} | | | | | | |")
            continue
        kind = r["kind"]
        ceil = ceiling_rate(cell, n, CEILING[kind])
        x = r["el_s"] / ceil if r["el_s"] and ceil else None
        part = "" if r["full_epoch"] else "~"
        here = local_rate(report, r["name"])
        x_local = r["el_s"] / here if r["el_s"] and here else None
        verdict = "-"
        if at_target:
            m = misses(r, kind, x, n, data, mosaic)
            verdict = "pass" if not m else "miss: " + ", ".join(m)
        print(
            f"| {r['name']} | {cache} | {_f(r['el_s'], ',.0f')} | "
            f"{_f(x, '.2f')} ({CEILING[kind]}) | {_f(x_local, '.2f')} | {_f(r['first_s'], '.2f')} | "
            f"{part}{r['epoch_bytes'] / 1e6:.1f} ({r['epoch_bytes'] / data:.2f}) | "
            f"{part}{r['epoch_requests']:,.0f} ({r['epoch_requests'] / n:.3f}) | {verdict} |"
        )
    for p in cell.get("peers", []):
        limit = "25% limit" if p.get("cache_limit") else "unbounded"
        if p.get("cache_peak"):
            limit += f", peak {p['cache_peak'] / 1e6:.1f} MB"
        if "error" in p:
            print(f"| peer {p['name']} | {limit} | refused/failed: {p['error']} | | | | | | |")
            continue
        ceil = ceiling_rate(cell, n, "whole_8")
        x = p["el_s"] / ceil if p.get("el_s") and ceil else None
        part = "" if p.get("full_epoch") else "~"
        print(
            f"| peer {p['name']}: {p.get('what', '')} | {limit} | {_f(p.get('el_s'), ',.0f')} | "
            f"{_f(x, '.2f')} (whole_8) | - | {_f(p.get('first_s'), '.2f')} | "
            f"{part}{p['epoch_bytes'] / 1e6:.1f} ({p['epoch_bytes'] / data:.2f}) | "
            f"{part}{p['epoch_requests']:,.0f} ({p['epoch_requests'] / n:.3f}) | - |"
        )
    print(
        "\n(~: a partial epoch, its MB and requests per epoch extrapolated per element read, "
        "what came before the first batch and responses of 256 KiB or more counted once; "
        "el/s from the first batch to the last; rows of whole epochs: the median of "
        f"{report.get('repeats', 1)} epochs; ratios against this proxy's ceiling)",
        flush=True,
    )
