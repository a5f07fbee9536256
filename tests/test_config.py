import subprocess
import sys

import pytest

from mclib.config import ConfigError, deviations, load_profile, profile_from_dict, profile_path


SHIPPED = sorted(p.stem for p in profile_path("paper").parent.glob("*.yaml"))


def test_the_shipped_profiles_are_the_documented_ones():
    assert SHIPPED == ["cpu", "cpu-7x7", "paper", "smoke"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_load(name):
    p = load_profile(profile_path(name))
    assert p.name == name and p.data.p_mask == 0.3
    # every profile keeps the paper's task except the default one, which is smaller (params/cpu.yaml)
    assert (p.data.n, p.data.rank) == ((5, 1) if name == "cpu" else (7, 2))


def test_paper_profile_is_the_paper():
    p = load_profile(profile_path("paper"))
    assert (p.model.layers, p.model.heads, p.model.hidden, p.model.intermediate) == (4, 8, 768, 3072)
    assert (p.train.lr, p.train.batch, p.train.steps, p.train.warmup) == (1e-4, 256, 50_000, 0)
    assert p.train.precision == "fp32"
    assert p.checkpoints.all_steps() == [4000, 10_000, 14_000, 16_000, 20_000, 50_000]


@pytest.mark.parametrize("raw,match", [
    ({"model": {"hedas": 8}}, "unknown key model.hedas"),
    ({"colour": 1}, "unknown key colour"),
    ({"data": {"rank": 9}}, "data.rank = 9"),
    ({"data": {"p_mask": 1.0}}, "data.p_mask = 1.0"),
    ({"data": {"p_mask": -0.1}}, "data.p_mask = -0.1"),
    ({"model": {"hidden": 0}}, "model.hidden = 0"),
    ({"train": {"batch": -4}}, "train.batch = -4"),
    ({"model": {"heads": 5, "hidden": 64}}, "model.heads = 5 does not divide model.hidden = 64"),
    ({"train": {"steps": 2.5}}, "train.steps = 2.5"),
    ({"train": {"precision": "fp8"}}, "train.precision = 'fp8'"),
    ({"train": {"lr": "fast"}}, "train.lr = 'fast'"),
    ({"train": {"steps": 100}, "checkpoints": {"pre": 50, "transition": [60], "post": 200}}, "200"),
    ({"train": {"beta2": 1.0}}, "train.beta2 = 1.0 is outside"),
    ({"train": {"grad_clip": -1}}, "train.grad_clip = -1.0 must not be negative"),
    ({"train": {"embedding_lr": 0}}, "train.embedding_lr = 0.0 must be positive"),
    ({"analysis": {"after_drop": -5}}, "analysis.after_drop = -5 must not be negative"),
    ({"analysis": {"after_drop": "soon"}}, "analysis.after_drop = 'soon' is not an integer"),
])
def test_bad_values_are_named(raw, match):
    with pytest.raises(ConfigError, match=match):
        profile_from_dict(raw)


def test_cli_reports_bad_profile_in_one_line_and_touches_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel: {heads: 3, hidden: 64}\n")
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "mclib", "train", "--params", str(bad), "--out", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "model.heads = 3" in r.stderr
    assert "Traceback" not in r.stderr and not out.exists()


def test_analysis_section_validates():
    p = profile_from_dict({"analysis": {"nuclear_p_masks": [0.1, 0.5], "seeds": [4]}})
    assert p.analysis.nuclear_p_masks == [0.1, 0.5] and p.analysis.seeds == [4]
    with pytest.raises(ConfigError, match="1.5"):
        profile_from_dict({"analysis": {"nuclear_p_masks": [0.1, 1.5]}})
    with pytest.raises(ConfigError, match="analysis.eval_matrices = 0"):
        profile_from_dict({"analysis": {"eval_matrices": 0}})


def test_compile_is_off_by_default_and_validated():
    assert profile_from_dict({}).train.compile is False
    for name in SHIPPED:
        assert load_profile(profile_path(name)).train.compile is False
    assert profile_from_dict({"train": {"compile": True}}).train.compile is True
    for bad in ("yes", 1):
        with pytest.raises(ConfigError, match=f"train.compile = {bad!r} is not true or false"):
            profile_from_dict({"train": {"compile": bad}})


def test_deviations_name_recipe_keys_only():
    paper = load_profile(profile_path("paper"))
    assert deviations(paper, paper) == []
    other = paper.replace(**{"data.n": 5, "train.lr": 1e-3, "train.threads": 1, "train.log_every": 7,
                             "checkpoints.pre": 10})
    assert deviations(other, paper) == [{"key": "data.n", "profile": 5, "paper": 7},
                                        {"key": "train.lr", "profile": 1e-3, "paper": 1e-4}]
