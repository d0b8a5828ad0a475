"""`python -m benchmarks.peers [setup | --quick | --rounds N | --only a,b | --out DIR]` from the
repo root.

Every peer's driver (`drive_<peer>.py`) runs in the peer's own venv, in a fresh process
per round, through the same workloads (`_wl.py`); servers are started once per run and
stopped by pid at the end. Rounds are interleaved (each round runs every peer, in an
order rotated per round), and every figure is the median over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import _report, _servers, _setup

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"
MAIN_PY = sys.executable  # the project's .venv: corral, the ceiling

# name -> (interpreter, driver, extra config, server starter or None)
PEERS: dict[str, tuple[Path | str, str, dict[str, Any], Any]] = {
    "corral": (MAIN_PY, "drive_corral.py", {}, None),
    "ceiling": (MAIN_PY, "drive_ceiling.py", {}, None),
    "temporal": (_setup.python_of("temporal"), "drive_temporal.py", {}, _servers.start_temporal),
    "restate": (_setup.python_of("restate"), "drive_restate.py", {}, _servers.start_restate),
    "dbos": (_setup.python_of("dbos"), "drive_dbos.py", {}, None),
    "ray": (_setup.python_of("ray"), "drive_ray.py", {}, None),
    "corral-mem": (MAIN_PY, "drive_corral.py", {"store": ":memory:"}, None),
    "pykka": (_setup.python_of("pykka"), "drive_pykka.py", {}, None),
}
FULL = {"inflight": 32, "w1_keys": 500, "w2_signals": 2000, "race": 200,
        "mem_entities": 5000, "lat_samples": 100, "apply_timeout": 120}
# W2 of the smoke run is large enough for W6: /proc counts CPU in 10 ms ticks, and 200
# signals took ~1 tick at 50 us each, so a run could measure 0.
QUICK = {"inflight": 32, "w1_keys": 50, "w2_signals": 1000, "race": 200,
         "mem_entities": 1000, "lat_samples": 20, "apply_timeout": 60}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_driver(name: str, cfg: dict[str, Any], server: _servers.Server | None,
               timeout: float) -> dict[str, Any]:
    py, script, extra, _ = PEERS[name]
    env = dict(os.environ)
    if server is not None:
        env.update(server.env)
        env["PEER_SERVER_PIDS"] = ",".join(map(str, server.pids))
    t = time.perf_counter()
    try:
        proc = subprocess.run([str(py), script, json.dumps({**cfg, **extra})], cwd=HERE,
                              env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if not lines:
        return {"ok": False, "error": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
    out: dict[str, Any] = json.loads(lines[-1][7:])
    out["wall_s"] = time.perf_counter() - t
    if not out.get("ok"):
        log(f"{name} failed:\n{proc.stderr[-2000:]}")
    return out


def machine() -> dict[str, Any]:
    return {"date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "load": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers")
    ap.add_argument("command", nargs="?", choices=["run", "setup"], default="run")
    ap.add_argument("names", nargs="*", help="setup: only these peers")
    ap.add_argument("--quick", action="store_true", help="small workloads, 1 round")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--only", default="", help="comma-separated peers (default: all)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per driver run")
    ap.add_argument("--out", type=Path, default=RESULTS,
                    help="directory for the JSON and the chart (default: benchmarks/results)")
    ap.add_argument("--report-only", action="store_true",
                    help="re-render the table and chart from the JSON of the last run")
    args = ap.parse_args()
    if args.command == "setup":
        sys.exit(_setup.setup(args.names or None))

    peers = [p for p in PEERS if not args.only or p in args.only.split(",")]
    rounds = args.rounds or (1 if args.quick else 3)
    sizes = QUICK if args.quick else FULL
    stem = "peers-quick" if args.quick else "peers"
    if args.report_only:
        report(args.out / f"{stem}.json")
        return
    status: dict[str, str] = {}
    servers: dict[str, _servers.Server] = {}
    start_machine = machine()
    results: dict[str, list[dict[str, Any]]] = {p: [] for p in peers}
    try:
        for p in peers:
            py, script, _, starter = PEERS[p]
            if not Path(py).exists():
                status[p] = "not installed (run: python -m benchmarks.peers setup)"
            elif not (HERE / script).exists():
                status[p] = "not run: no driver"
            else:
                status[p] = "ok"
            if status[p] == "ok" and starter is not None:
                log(f"starting {p} server")
                try:
                    servers[p] = starter()
                    log(f"{p} server up: pids {servers[p].pids}")
                except Exception as err:
                    status[p] = f"cannot start: {err}"[:200]
            if status[p] != "ok":
                log(f"{p}: {status[p]}")
        active = [p for p in peers if status[p] == "ok"]
        for r in range(rounds):
            order = active[r % len(active):] + active[:r % len(active)] if active else []
            for p in order:
                cfg = {**sizes, "tag": f"r{r}-{int(time.time())}"}
                log(f"round {r + 1}/{rounds}: {p}")
                res = run_driver(p, cfg, servers.get(p), args.timeout)
                res["load1"] = os.getloadavg()[0]
                results[p].append(res)
                log(f"  {p}: {'ok' if res.get('ok') else res.get('error')} "
                    f"({res.get('wall_s', 0):.1f} s)")
    finally:
        for srv in servers.values():
            srv.stop()
    for p in active:
        if not any(r.get("ok") for r in results[p]):
            status[p] = "failed: " + str(results[p][-1].get("error", "?"))[:150]
    data = {"quick": args.quick, "sizes": sizes, "rounds": rounds, "machine_start": start_machine,
            "machine_end": machine(), "peers": peers, "status": status,
            "median": {p: _report.median_result(results[p]) for p in peers}, "all": results}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.json"
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    report(path)


def report(path: Path) -> None:
    """Print the tables and draw the chart from a run's JSON (adds the table to it)."""
    data = json.loads(path.read_text())
    peers, status, med, sizes = data["peers"], data["status"], data["median"], data["sizes"]
    m0, m1 = data["machine_start"], data["machine_end"]
    header = (f"{'QUICK (smoke) run, ' if data['quick'] else ''}{m0['date_utc']}, "
              f"{m0['cpus']} CPUs, load {m0['load'][0]:.1f} -> {m1['load'][0]:.1f}, "
              f"medians of {data['rounds']} interleaved round(s); "
              f"W1 {sizes['w1_keys']} keys, W2 {sizes['w2_signals']} signals, "
              f"W4 {sizes['mem_entities']} entities, W5 {sizes['lat_samples']} samples")
    text = _report.tables(peers, med, status)
    print(header + "\n\n" + text)
    data["table"] = text
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    png = path.with_suffix(".png")
    err = _report.chart(png, peers, med, status, header)
    print(f"wrote {path}" + (f"; chart skipped: {err}" if err else f" and {png.name}"))


if __name__ == "__main__":
    main()
