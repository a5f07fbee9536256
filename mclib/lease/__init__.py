"""How a GPU lease works: the paper's own setting (params/paper.yaml: 7×7 rank 2, 4 layers ×
8 heads, hidden 768), trained and analysed in slices of 15 minutes on a lent GPU, then merged
here and shown beside the laptop edition. Everything of it is in this folder.

    slices.py      the ledger (results/paper-slices.yaml: the slices in order, what each trains
                   and executes), `status`, `next_slice`, the step variant a slice trains with,
                   and the lease's limits
    slices_run.py  a slice's life on the GPU machine: `start` (refuses what cannot fit, trains
                   detached under the slice's deadline), `finish` (its chapters executed through
                   the book's runner, results.tgz packed)
    slices_pack.py what a lease sends back (results.tgz, `collect`) and `merge` (filed under
                   results/ back on the CPU machine)
    steptable.py   the step tables leases measure, committed side by side by device kind, and when
                   one stands for a lease (the same step files, torch, device and precision: only the
                   chosen variant checked); `slice status` plans with the chosen variant's step
    reference.py   the paper setting's results under results/: collected from a built book,
                   the runs they hold, and their scorecard rows re-judged by today's rules (the
                   rules are the chapters' own, from their specs: `mclib.book.spec`)
    part.py        the site's part "The paper's own setting": the chapters the leases executed,
                   each with where, when and how its runs ended
    precision.py   the slices' precision (TF32) as a departure: why, the TF32 study's table, and
                   its measured effect beside every row that reads a final level

One entry point: `python -m mclib slice start|finish|merge|status` (mclib/__main__.py), which
scripts/lease.sh issues on the GPU machine (docs/gpu.md gives the two commands exactly). The
detached trainer a slice starts is `python -m mclib.lease.slices_run`.

Its place among the rooms (tests/test_layers.py): above the core it trains with, the analyses
and the book's shared machinery (runner, scorecard, plots); below the chapters, which read its
results (the scorecard chapter, chapter 07's follow-up) and declare the rows it re-judges.
"""
