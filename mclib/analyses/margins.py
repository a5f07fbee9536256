"""The relative margins of the scorecard's rules, one per kind of claim (`MARGINS`): the book's
rules judge by them (`mclib.book.scorecard_rules`), and the analyses that stop a run once its
rows are known read the same numbers (`mclib.analyses.freezing.rows_known`), so a run stops
exactly where the scorecard's verdict is decided. Defined here, the lower room, once."""

# The relative margins of the rules, each added to two standard errors of our number.
MARGINS = {
    # A number: 10 %, about the sampling error of the paper's own means (256 matrices; our
    # per-matrix spread gives 8-9 % at that size, and the paper reports no error), i.e. two
    # significant figures give or take one.
    "number": 0.10,
    # A ratio of two losses measured on the same matrices (ablated / unablated, switched /
    # unswitched): 25 % on the log scale (a factor 1.25 either way). The ratio is the
    # scale-free part of an intervention's effect; a quarter allows for the paper's two
    # sampling errors (~10 % each) and a model of another size, no more.
    "ratio": 0.25,
    # A direction (ours above or below a stated reference): beyond the reference by 10 %
    # of it, so a value sitting on the reference does not count either way.
    "direction": 0.10,
    # A finding of our own: as a direction, for the same reason (0 for a cut-off, CUT).
    "finding": 0.10,
    # An ordering of events (steps): each later item later by 10 % of its step, so two
    # events at about the same checkpoint are not an ordering.
    "ordering": 0.10,
}
