"""The book's machinery: what turns runs into pages.

    runner*.py       `python -m mclib book` (`build`, `plan`): which runs train, executing chapters, the site
    spec.py          `ChapterSpec`: what a chapter declares to the machinery
    chapter.py       `open_chapter`, every chapter's first call; downloads; departures from the paper
    chapter_card.py  the analysis checkpoints' model cards
    scorecard*.py    the scorecard: rows and recording, rules, runs cut short, counts and sentences
    plots_base.py    the plot theme and `closed`; plots_curves.py the loss curves several chapters
                     and the lease draw (a figure one chapter draws lives with that chapter)

Nothing here imports a chapter (mclib/chapters/): the runner and the GPU lease (mclib/lease/)
are handed the chapters' specs, which mclib.chapters.registry collects.
"""
