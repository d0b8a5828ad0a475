"""Medians, the tables (absolute figures and corral's advantage) and the bar chart."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

# (key, label, unit, higher_is_better)
METRICS: list[tuple[str, str, str, bool]] = [
    ("w1_seq_per_s", "W1 signal-with-start, distinct keys, sequential", "/s", True),
    ("w1_par_per_s", "W1 signal-with-start, distinct keys, 32 in flight", "/s", True),
    ("w2_seq_per_s", "W2 signals to one entity, sequential: accepted", "/s", True),
    ("w2_seq_applied_s", "W2 sequential: until all applied", "s", False),
    ("w2_par_per_s", "W2 signals to one entity, 32 in flight: accepted", "/s", True),
    ("w2_par_applied_s", "W2 32 in flight: until all applied", "s", False),
    ("w4_bytes_per_entity", "W4 memory per idle entity (PSS, whole system)", "B", False),
    ("w5_p50_ms", "W5 idle entity, send to applied, p50", "ms", False),
    ("w5_p99_ms", "W5 idle entity, send to applied, p99", "ms", False),
    ("w6_cpu_ms_per_signal", "W6 CPU per signal, all processes (W2 32 in flight)", "ms", False),
]
# the peer whose ratio each peer is compared with: Pykka is not durable, nor is corral-mem
REFERENCE = {"pykka": "corral-mem", "corral-mem": None, "corral": None}


def median_result(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rounds if r.get("ok")]
    out: dict[str, Any] = {"rounds_ok": len(ok), "rounds": len(rounds)}
    if not ok:
        return out
    for key in {k for r in ok for k, v in r.items() if isinstance(v, (int, float))}:
        vals = [r[key] for r in ok if isinstance(r.get(key), (int, float))]
        if vals:
            out[key] = statistics.median(vals)
    for key in ("w1_extrapolated", "w2_capped", "w4_capped", "w3_error_sample", "versions"):
        out[key] = ok[-1].get(key)
    return out


def fmt(v: Any, unit: str = "") -> str:
    if v is None:
        return "-"
    if unit == "B":
        return f"{v / 1024:,.1f} KiB" if v < 2**20 else f"{v / 2**20:,.1f} MiB"
    if isinstance(v, float):
        if v >= 100:
            return f"{v:,.0f}"
        return f"{v:.3g}" if v >= 0.01 else f"{v:.2g}"
    return f"{v:,}"


def ratio(corral: Any, peer: Any, higher: bool) -> str:
    if not isinstance(corral, (int, float)) or not isinstance(peer, (int, float)) or not peer \
            or not corral:
        return "-"
    r = corral / peer if higher else peer / corral
    if r < 1:
        return f"{r:.2g}x"
    return f"{r:,.1f}x" if r < 100 else f"{r:,.0f}x"


def cell(m: dict[str, Any], status: str, key: str, unit: str) -> str:
    if status != "ok":
        return "n/a"
    v = m.get(key)
    s = fmt(v, unit)
    if key.startswith("w1_") and m.get("w1_extrapolated") and v is not None:
        s += f" ({int(m.get('w1_keys', 0))} keys)*"
    if key.startswith("w2_") and m.get("w2_capped") and v is not None:
        s += f" ({int(m.get('w2_signals', 0))} signals)*"
    if key.startswith("w4_") and m.get("w4_capped") and v is not None:
        s += f" ({int(m.get('w4_entities', 0))} entities)*"
    return s


def tables(peers: list[str], med: dict[str, dict[str, Any]], status: dict[str, str]) -> str:
    head = "| workload | " + " | ".join(peers) + " |\n|---|" + "---|" * len(peers) + "\n"
    lines = [head]
    for key, label, unit, _ in METRICS:
        lines.append(f"| {label} ({unit}) | "
                     + " | ".join(cell(med.get(p, {}), status[p], key, unit) for p in peers)
                     + " |\n")
    for key, label in (("w3_runs", "W3 200-way race: runs started"),
                       ("w3_applied", "W3 race: signals applied (of 200)"),
                       ("w3_errors", "W3 race: caller errors")):
        lines.append(f"| {label} | " + " | ".join(
            fmt(med.get(p, {}).get(key)) if status[p] == "ok" else "n/a" for p in peers) + " |\n")
    lines.append("| status | " + " | ".join(status[p] for p in peers) + " |\n")
    lines.append("\n`*` fewer keys, signals or entities than the others (one Ray actor is a "
                 "process; the durable peers start ~10-100 entities/s here): rates are per "
                 "key, signal or entity.\n"
                 if any(med.get(p, {}).get(f) for p in peers
                        for f in ("w1_extrapolated", "w2_capped", "w4_capped")) else "")
    others = [p for p in peers if REFERENCE.get(p, "corral") is not None]
    lines.append("\ncorral's advantage (rates: corral / peer; times, memory, CPU: peer / corral; "
                 "> 1 = corral better; Pykka against corral on `:memory:`):\n\n")
    lines.append("| workload | " + " | ".join(f"vs {p}" for p in others) + " |\n|---|"
                 + "---|" * len(others) + "\n")
    for key, label, _unit, higher in METRICS:
        row = []
        for p in others:
            ref = REFERENCE.get(p, "corral") or "corral"
            ok = status[p] == "ok" and status.get(ref) == "ok"
            mine, theirs = med.get(ref, {}).get(key), med.get(p, {}).get(key)
            if key.endswith("_applied_s") and mine and theirs:  # per signal: N may differ
                mine, theirs = mine / med[ref]["w2_signals"], theirs / med[p]["w2_signals"]
            row.append(ratio(mine, theirs, higher) if ok else "n/a")
        lines.append(f"| {label} | " + " | ".join(row) + " |\n")
    return "".join(lines)


def chart(path: Path, peers: list[str], med: dict[str, dict[str, Any]],
          status: dict[str, str], title: str) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib missing: .venv/bin/pip install matplotlib"
    shown = [m for m in METRICS if m[0] not in ("w5_p99_ms",)]
    fig, axes = plt.subplots(3, 3, figsize=(15, 11))
    for ax, (key, label, unit, higher) in zip(axes.flat, shown, strict=False):
        names = [p for p in peers if status[p] == "ok" and med[p].get(key)]
        vals = [med[p][key] for p in names]
        colors = ["tab:green" if p.startswith("corral") else
                  "tab:gray" if p == "ceiling" else "tab:blue" for p in names]
        ax.bar(names, vals, color=colors)
        ax.set_yscale("log")
        ax.set_title(f"{label}\n({unit}, {'higher' if higher else 'lower'} is better)",
                     fontsize=9)
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        for i, v in enumerate(vals):
            ax.text(i, v, fmt(v, unit), ha="center", va="bottom", fontsize=7)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return None
