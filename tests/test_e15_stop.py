"""E15's runs stop once what chapter 05 reads of them is known (`freezing.rows_known`):
the rule agrees with the scorecard's own judgement at the step where it fires, and it
never fires for a run whose verdicts could still change."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from mclib.analyses import freezing
from mclib.analyses.sharpness import ABRUPT, SETTLE
from mclib.book import scorecard_rules
from mclib.core.metrics import rows_curve
from tests.test_convergence import curve


def _cfg(smoke_profile):
    return smoke_profile.replace(
        **{
            "train.patience": 500,
            "train.min_improvement": 0.05,
            "data.rank": 1,
            "analysis.freeze_steps": 8000,
        }
    )


def _first_stop(stop, m: pd.DataFrame, every: int = 50) -> int | None:
    """The first flush (every `every` steps, as `train` asks) at which `stop` is true."""
    rows = m.assign(L=m["L_mask"]).to_dict("records")
    for end in range(every, len(rows) + 1, every):
        if stop(rows[:end]):
            return rows[end - 1]["step"]
    return None


@pytest.mark.parametrize("cut, se", [(SETTLE, 0.02), (ABRUPT, None)], ids=["recovery", "plateau over fall"])
def test_the_stop_rule_s_edge_is_where_the_scorecard_s_direction_rule_decides(cut, se):
    """`rows_known` lets a run stop once its value (+ two standard errors) lies below
    cut·(1 − KNOWN_MARGIN): just inside that edge the scorecard's direction rule says "same
    direction", just outside it does not. The margin is one number (mclib.analyses.margins);
    this holds the two rules' use of it together."""
    edge = cut * (1 - freezing.KNOWN_MARGIN) - 2 * (se or 0.0)
    step = 1e-6 * cut
    assert scorecard_rules.direction(edge - step, cut, "below", se=se) == "same direction"
    assert scorecard_rules.direction(edge + step, cut, "below", se=se) != "same direction"


def test_a_recovered_run_stops_once_its_rows_are_known_and_the_scorecard_agrees(smoke_profile):
    cfg = _cfg(smoke_profile)
    m = curve(6000, drop_at=400, final=0.01, tau=300, noise=0.05)
    main = freezing.Yardstick(final=0.008, se=0.0002)  # the run ends at 1.25x the main run's level
    at = _first_stop(freezing.freeze_stop(cfg, None, main), m)
    drop = freezing.find_drop(m, rank=1)
    assert at is not None and drop + cfg.train.patience <= at < 6000
    ran = m[m["step"] <= at]
    ratio, se = freezing.recovery(ran, cfg.train.patience, main)
    # the rows chapter 05 would record from the run as it stopped: their verdicts are decided
    assert scorecard_rules.direction(ratio, SETTLE, "below", se=se) == "same direction"
    fall = freezing.plateau_over_fall(ran, 1)
    assert fall < ABRUPT * (1 - freezing.KNOWN_MARGIN)
    assert scorecard_rules.direction(fall, ABRUPT, "below") == "same direction"
    end = freezing.freeze_end("mlp", ran, cfg, None, main)
    assert (
        end.ended == "known"
        and end.steps == at
        and f"stopped at step {at:,}, once its rows were known" in end.text
    )
    # one flush earlier the rule had not fired
    assert not freezing.rows_known(m[m["step"] <= at - 50], cfg, main)


@pytest.mark.parametrize(
    "why, drop_at, tau, main_final",
    [
        ("not recovered: the run ends at 2.5x the main run's level", 400, 300, 0.004),
        ("a long plateau and a quick fall: plateau over fall may still fall below 1", 3000, 20, 0.008),
    ],
)
def test_a_run_whose_verdict_could_change_does_not_stop_early(smoke_profile, why, drop_at, tau, main_final):
    cfg = _cfg(smoke_profile)
    m = curve(6000, drop_at=drop_at, final=0.01, tau=tau)
    main = freezing.Yardstick(final=main_final, se=0.0001)
    assert _first_stop(freezing.freeze_stop(cfg, None, main), m) is None, why
    assert freezing.freeze_end("attention", m, cfg, None, main).ended == "converged"


def test_without_a_drop_the_rule_never_fires_and_the_main_drop_rule_still_does(smoke_profile):
    cfg = _cfg(smoke_profile)
    m = curve(3000, drop_at=None)
    main = freezing.Yardstick(final=0.01, se=0.001)
    assert not freezing.rows_known(m, cfg, main)
    assert _first_stop(freezing.freeze_stop(cfg, 2000, main), m) == 2000
    assert freezing.freeze_stop(cfg, None, None) is None
    assert math.isnan(freezing.recovery(m.head(5), 500, main)[0])  # too few rows for a level


def test_rows_curve_is_what_the_stop_reads():
    rows = [{"step": 1, "L": 0.2, "L_mask": 0.1, "L_obs": 0.3}]
    assert list(rows_curve(rows).columns) == ["step", "L", "L_mask"]
