"""The paper's own setting (params/paper.yaml: 7×7 rank 2, 4 layers × 8 heads, hidden 768) on GPU
leases: trained and analysed in slices of one 15-minute lease each, merged here and shown beside
the laptop edition (docs/gpu.md).

    slices.py      the ledger (results/paper-slices.yaml), `status`, `next_slice`, the lease's limits
    slices_run.py  on the GPU machine: `start` (refuses what cannot fit, trains detached), `finish`
    slices_pack.py what a lease sends back (results.tgz, `collect`) and `merge` (on the CPU machine)
    steptable.py   the committed step tables by device kind, and when one stands for a lease
    stepbench.py   the variants, table and profiles of benchmarks/lease_step.py
    reference.py   the results under results/: their runs, and their rows re-judged by today's rules
    rejudging.py   the re-judging itself: the chapters' rules and today's verdicts on recorded rows
    same_seed.py   every run of seed 1 side by side, and the rounding spread of their drop steps
    part.py        the site's part "The paper's own setting": the chapters the leases executed
    precision.py   the slices' TF32 as a departure, with the TF32 study's measured effect

Entry point: `python -m mclib slice start|finish|merge|status` (scripts/lease.sh on the GPU
machine); the detached trainer is `python -m mclib.lease.slices_run`. Layering
(tests/test_layers.py): above the core, the analyses and the book's shared machinery (runner,
scorecard, plots); below the chapters, which read its results and declare the rows it re-judges.
"""
