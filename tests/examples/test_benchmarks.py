"""The peers benchmark (`python -m benchmarks.peers`) runs end to end on corral and the
raw ceiling, so the published comparison cannot rot unnoticed. The other peers are never
needed by the suite; one that is not installed must be reported as such, never dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from corral.persistence import open_sqlite_store

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a whole benchmark run in a subprocess: up to minutes on a busy machine
def test_the_peers_harness_measures_corral_and_the_ceiling_and_reports_a_missing_peer(
        tmp_path: Path) -> None:
    env = {**os.environ, "CORRAL_PEERS_ENVS": str(tmp_path / "no-peer-envs")}
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.peers", "--quick", "--only",
         "corral,ceiling,temporal", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    data = json.loads((tmp_path / "peers-quick.json").read_text())

    assert data["status"]["corral"] == "ok"
    assert data["status"]["ceiling"] == "ok"
    assert data["status"]["temporal"].startswith("not installed")
    corral, sizes = data["median"]["corral"], data["sizes"]
    assert corral["ok"]
    assert corral["rounds_ok"] == 1
    # W3: one run started by the 200-way race, every signal applied, no caller error.
    assert (corral["w3_runs"], corral["w3_applied"], corral["w3_errors"]) == \
        (1, sizes["race"], 0)
    assert corral["w2_seq_applied"] == corral["w2_par_applied"] == sizes["w2_signals"]
    for figure in ("w1_seq_per_s", "w1_par_per_s", "w2_par_per_s", "w5_p50_ms",
                   "w6_cpu_ms_per_signal", "w4_bytes_per_entity"):
        assert corral[figure] > 0, figure
    assert data["median"]["ceiling"]["w2_par_per_s"] > 0
    # The table names the missing peer and gives corral's ratios against the ceiling.
    table = data["table"]
    assert "not installed" in table
    assert "vs ceiling" in table
    assert "| W3 race: caller errors | 0 |" in table


async def test_the_sqlite_ceiling_writes_into_the_schema_the_store_creates(tmp_path: Path
                                                                          ) -> None:
    # A ceiling without one of the store's indexes writes less per row than corral must:
    # every ratio against it would understate corral.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import accept
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    ceiling = accept.CeilingWriter(str(tmp_path / "ceiling.db"))
    await ceiling.open()
    await ceiling.close()
    await (await open_sqlite_store(str(tmp_path / "store.db"), shards=accept.SHARDS)).close()

    def schema(name: str) -> list[tuple[str, str, str]]:
        with contextlib.closing(sqlite3.connect(tmp_path / name)) as db:
            return db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()

    assert schema("ceiling.db") == schema("store.db")
    assert ("index", "dedupe_seq") in [row[:2] for row in schema("ceiling.db")]
