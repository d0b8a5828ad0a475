"""corral side by side with Temporal, Restate, DBOS, Pykka, plain Ray and the raw ceiling.

`python -m benchmarks.peers setup` creates every peer's venv under benchmarks/.peers/;
`python -m benchmarks.peers [--quick]` runs the workloads (see benchmarks/README.md).
"""
