import subprocess
import sys
from dataclasses import fields

import pytest

from mclib.core import paper
from mclib.core.config import (
    REMOVED,
    REMOVED_RUNNING,
    Analysis,
    Checkpoints,
    ConfigError,
    DataConfig,
    ModelConfig,
    Profile,
    TrainConfig,
    load_profile,
    parse_yaml,
    profile_from_dict,
    profile_from_saved,
    profile_path,
)
from mclib.core.recipe import deviations

SHIPPED = sorted(p.stem for p in profile_path("paper").parent.glob("*.yaml"))


def test_the_shipped_profiles_are_the_documented_ones():
    assert SHIPPED == ["cpu", "cpu-7x7", "gpt", "paper", "smoke", "smoke-drop"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_load(name):
    p = load_profile(profile_path(name))
    # every profile keeps the paper's task except the default one, which is smaller (params/cpu.yaml),
    # the test profile that must drop within minutes (params/smoke-drop.yaml), and E19's GPT,
    # on the default book's task (the book runs it on the book's own task: ch08_gpt.gpt_profile)
    task = {"cpu": (5, 1, 0.3), "gpt": (5, 1, 0.3), "smoke-drop": (3, 1, 0.2)}.get(name, (7, 2, 0.3))
    assert p.name == name and (p.data.n, p.data.rank, p.data.p_mask) == task


def test_paper_profile_is_the_paper():
    p = paper.profile()
    assert (p.model.layers, p.model.heads, p.model.hidden, p.model.intermediate) == (4, 8, 768, 3072)
    assert (p.train.lr, p.train.batch, p.train.steps, p.train.warmup) == (1e-4, 256, 50_000, 0)
    assert p.train.precision == "fp32"
    assert p.checkpoints.all_steps() == [4000, 10_000, 14_000, 16_000, 20_000, 50_000]


@pytest.mark.parametrize(
    "raw,match",
    [
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
        ({"analysis": {"after_drop": -5}}, "analysis.after_drop = -5 must not be negative"),
        ({"analysis": {"after_drop": "soon"}}, "analysis.after_drop = 'soon' is not an integer"),
    ],
)
def test_bad_values_are_named(raw, match):
    with pytest.raises(ConfigError, match=match):
        profile_from_dict(raw)


@pytest.mark.slow
def test_cli_reports_bad_profile_in_one_line_and_touches_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nmodel: {heads: 3, hidden: 64}\n")
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "mclib", "train", "--profile", str(bad), "--out", str(out)],
        capture_output=True,
        text=True,
    )
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
    # on only where the benchmark measured a gain (cpu: 0.84x the step, docs/performance.md);
    # the tests' smoke profile and the GPU paper profile stay eager
    assert {name for name in SHIPPED if load_profile(profile_path(name)).train.compile} == {"cpu"}
    assert profile_from_dict({"train": {"compile": True}}).train.compile is True
    for bad in ("yes", 1):
        with pytest.raises(ConfigError, match=f"train.compile = {bad!r} is not true or false"):
            profile_from_dict({"train": {"compile": bad}})


def test_deviations_name_recipe_keys_only():
    theirs = paper.profile()
    assert deviations(theirs, theirs) == []
    other = theirs.replace(
        **{"data.n": 5, "train.lr": 1e-3, "train.threads": 1, "train.log_every": 7, "checkpoints.pre": 10}
    )
    assert deviations(other, theirs) == [
        {"key": "data.n", "profile": 5, "paper": 7},
        {"key": "train.lr", "profile": 1e-3, "paper": 1e-4},
    ]


# --- every key, every check ------------------------------------------------------------

SECTIONS = {
    "data": DataConfig,
    "model": ModelConfig,
    "train": TrainConfig,
    "checkpoints": Checkpoints,
    "analysis": Analysis,
}
ALL_KEYS = [f.name for f in fields(Profile) if f.name not in SECTIONS] + [
    f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in fields(cls)
]


def _raw(key: str, value) -> dict:
    *section, leaf = key.split(".")
    return {section[0]: {leaf: value}} if section else {leaf: value}


def _wrong_type(key: str):
    """A value of the wrong type for `key` and the words of the message it must give."""
    typ = str(
        next(f.type for f in fields(SECTIONS.get(key.split(".")[0], Profile)) if f.name == key.split(".")[-1])
    )
    if typ.startswith("list"):
        return ["x"], "'x' is not an integer" if "int" in typ else "'x' is not a number"
    if typ.startswith("int"):
        return "x", "'x' is not an integer"
    if typ.startswith("float"):
        return "x", "'x' is not a number"
    if typ == "bool":
        return "yes", "'yes' is not true or false"
    return 5, "5 is not a string"


def _one_line_error(raw) -> str:
    with pytest.raises(ConfigError) as e:
        profile_from_dict(raw)
    assert "\n" not in str(e.value)
    return str(e.value)


OLD_RUN = profile_path("paper").parents[1] / "results" / "paper-NVIDIA-H100-80GB-HBM3-2026-11-24" / "runs"


def test_a_run_saved_before_the_levers_left_loads_while_they_are_off():
    """A profile.yaml written at c6ddcac or before holds every REMOVED lever (a committed H100
    run's does): it loads as the profile it was; with one lever on, or in a profile of
    params/, the key is unknown, in one line naming it."""
    import yaml

    raw = yaml.safe_load((OLD_RUN / "paper-seed1" / "profile.yaml").read_text())
    assert {f"{s}.{k}" for s, keys in raw.items() if isinstance(keys, dict) for k in keys} >= {
        *REMOVED,
        *REMOVED_RUNNING,
    }
    p = profile_from_saved(raw)
    assert (p.name, p.data.n, p.model.hidden, p.train.lr) == ("paper", 7, 768, 1e-4)
    with pytest.raises(ConfigError) as e:
        profile_from_dict(raw)  # strict: read as a profile of params/, every removed key is unknown
    assert sorted(m.split()[2] for m in e.value.problems) == sorted([*REMOVED, *REMOVED_RUNNING])
    for key, off in REMOVED.items():
        section, leaf = key.split(".")
        with pytest.raises(ConfigError, match=rf"^unknown key {key} = .+ \(known: "):
            profile_from_dict(_raw(key, off))  # a profile of params/ may not name it
        on = {**raw, section: {**raw[section], leaf: "on"}}
        with pytest.raises(ConfigError, match=rf"^unknown key {key} = .+ \(known: "):
            profile_from_saved(on)
    for key in REMOVED_RUNNING:  # train.fast: read as absent at any value, in a saved profile only
        section, leaf = key.split(".")
        for value in (True, False):
            assert profile_from_saved({**raw, section: {**raw[section], leaf: value}}) == p
        with pytest.raises(ConfigError, match=rf"^unknown key {key} = .+ \(known: "):
            profile_from_dict(_raw(key, True))


@pytest.mark.parametrize("key", ALL_KEYS)
def test_every_key_rejects_a_value_of_the_wrong_type(key):
    value, words = _wrong_type(key)
    where = f"{key}[0]" if isinstance(value, list) else key  # a list's item is named by its place
    assert _one_line_error(_raw(key, value)) == f"{where} = {words}"


@pytest.mark.parametrize("section", list(SECTIONS))
def test_a_section_that_is_not_a_mapping_is_named(section):
    assert _one_line_error({section: [1, 2]}) == f"{section} = [1, 2] is not a mapping"


# Every key checked beyond its type: (key, bad value, the message). Written out here rather
# than read from config._POSITIVE / _CHOICES, so that a check removed there fails a test.
POSITIVE_INT = [
    "data.n",
    "data.rank",
    "model.layers",
    "model.heads",
    "model.hidden",
    "model.intermediate",
    "train.steps",
    "train.batch",
    "train.eval_every",
    "train.eval_batch",
    "train.save_every",
    "train.log_every",
    "train.patience",
    "analysis.headline_matrices",
    "analysis.eval_matrices",
    "analysis.copy_matrices",
    "analysis.probe_fit",
    "analysis.probe_test",
    "analysis.freeze_steps",
    "analysis.nuclear_matrices",
    "analysis.regularised_matrices",
    "analysis.solver_matrices",
    "analysis.ood_matrices",
]
POSITIVE_FLOAT = ["model.init_std", "train.lr"]
CHOICES = [
    "data.dist",
    "model.attention",
    "model.kind",
    "train.precision",
    "train.adam",
    "train.device",
    "train.until",
    "train.step",
    "checkpoints.place",
    "checkpoints.keep",
]
RANGE_CHECKS = (
    [(k, 0, f"{k} = 0 must be positive") for k in POSITIVE_INT]
    + [(k, -1, f"{k} = -1.0 must be positive") for k in POSITIVE_FLOAT]
    + [(k, "bogus", f"{k} = 'bogus' is not one of") for k in CHOICES]
    + [
        ("data.p_mask", 1.0, "data.p_mask = 1.0 is outside [0, 1)"),
        (
            "train.state_every",
            1500,
            "train.state_every = 1500 is not 0 or a positive multiple of train.save_every = 1000",
        ),
        ("train.state_every", -1000, "train.state_every = -1000 is not 0 or a positive multiple"),
        ("data.p_mask", -0.1, "data.p_mask = -0.1 is outside [0, 1)"),
        ("train.beta2", 1.0, "train.beta2 = 1.0 is outside [0, 1)"),
        ("train.grad_clip", -1, "train.grad_clip = -1.0 must not be negative"),
        ("train.warmup", -1, "train.warmup = -1 must not be negative"),
        ("train.threads", -1, "train.threads = -1 must not be negative"),
        ("train.min_improvement", 1.0, "train.min_improvement = 1.0 is outside [0, 1)"),
        ("train.min_improvement", -0.01, "train.min_improvement = -0.01 is outside [0, 1)"),
        ("checkpoints.pre", 0, "checkpoints step 0 is outside 1..train.steps = 50000"),
        ("checkpoints.transition", [10, 60_000], "checkpoints step 60000 is outside 1..train.steps = 50000"),
        ("checkpoints.post", 50_001, "checkpoints step 50001 is outside 1..train.steps = 50000"),
        ("analysis.nuclear_p_masks", [0.3, 1.0], "analysis.nuclear_p_masks[1] = 1.0 is outside (0, 1)"),
        ("analysis.nuclear_p_masks", [0.0], "analysis.nuclear_p_masks[0] = 0.0 is outside (0, 1)"),
        ("analysis.seeds", [], "analysis.seeds = [] must name at least one seed"),
        ("analysis.after_drop", -1, "analysis.after_drop = -1 must not be negative"),
        ("analysis.gpt_steps", 0, "analysis.gpt_steps = 0 must be positive"),
        ("seed", -1, "seed = -1 must not be negative"),
        ("model.attn_bias", -0.5, "model.attn_bias = -0.5 must be a finite number >= 0"),
        ("model.attn_bias", float("nan"), "model.attn_bias = nan must be a finite number >= 0"),
        ("model.attn_bias", float("inf"), "model.attn_bias = inf must be a finite number >= 0"),
        ("model.attn_bias_target", "rows", "model.attn_bias_target = 'rows' is not one of row_col, other"),
    ]
)
# keys whose only check is their type (any value of it is valid)
TYPE_ONLY = {
    "name",
    "notes",
    "analysis.seed",
    "train.compile",
    "analysis.download_checkpoint",
    "analysis.freeze",
    "analysis.train_in_book",
}
# keys checked only together with another key (test_checks_across_keys)
CROSS_CHECKED: set[str] = set()


@pytest.mark.parametrize("key, value, message", RANGE_CHECKS, ids=[f"{k}={v!r}" for k, v, _ in RANGE_CHECKS])
def test_every_checked_key_rejects_a_bad_value(key, value, message):
    assert _one_line_error(_raw(key, value)).startswith(message)


def test_every_key_is_either_range_checked_or_type_only():
    # a new profile key must get a line in RANGE_CHECKS (or be declared type-only here)
    checked = {k for k, _, _ in RANGE_CHECKS}
    assert set(ALL_KEYS) - checked - TYPE_ONLY - CROSS_CHECKED == set() and checked <= set(ALL_KEYS)


def test_checks_across_keys():
    assert _one_line_error({"data": {"n": 3, "rank": 4}}) == "data.rank = 4 is larger than data.n = 3"
    assert (
        _one_line_error({"model": {"heads": 5, "hidden": 64}})
        == "model.heads = 5 does not divide model.hidden = 64"
    )
    assert _one_line_error({"train": {"steps": 2.5}}) == "train.steps = 2.5 is not an integer"
    # the same limits just inside are fine
    p = profile_from_dict(
        {"data": {"n": 3, "rank": 3, "p_mask": 0.0}, "train": {"beta2": 0.0, "grad_clip": 0}}
    )
    assert (p.data.rank, p.data.p_mask, p.train.beta2) == (3, 0.0, 0.0)


def _load_error(path, text: str | None) -> str:
    """The one-line ConfigError that load_profile raises for a file holding `text`
    (None: no file at all)."""
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_profile(path)
    return str(e.value)


def test_a_bad_value_in_a_file_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "p.yaml"
    assert _load_error(path, "data: {n: 0}\n") == f"{path}: data.n = 0 must be positive"


def test_malformed_yaml_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "broken.yaml"
    message = _load_error(path, "data: {n: 7\nmodel: [\n")
    assert message.startswith(f"profile file {str(path)!r} is not valid YAML: ") and "\n" not in message


def test_parse_yaml_reads_every_yaml_file_of_the_repository_as_safe_load_does():
    """parse_yaml takes libyaml's parser where PyYAML has it; the values must be safe_load's,
    down to the type (1 vs 1.0 vs "1", dates, None)."""
    import yaml

    root = profile_path("paper").parents[1]
    files = [p for d in ("params", "results", "sweeps", ".") for p in sorted((root / d).glob("*.y*ml"))]
    assert len(files) > 20
    for path in files:
        text = path.read_text()
        expected, got = yaml.safe_load(text), parse_yaml(text)
        assert got == expected and repr(got) == repr(expected), path


def test_a_missing_file_is_named(tmp_path):
    path = tmp_path / "nowhere.yaml"
    assert _load_error(path, None) == f"profile file {str(path)!r} does not exist"


def test_a_yaml_file_that_is_not_a_mapping_is_refused(tmp_path):
    assert "is not a mapping" in _load_error(tmp_path / "list.yaml", "- 1\n- 2\n")


# --- every bad value at once ---------------------------------------------------------------

SEVERAL = {
    "data": {"n": 5, "rank": 9, "p_mask": 1.5},
    "train": {"lr": -1},
    "model": {"heads": 3, "hidden": 16},
}
# each key's own range first, in the schema's order, then the checks across keys
SEVERAL_LINES = [
    "data.p_mask = 1.5 is outside [0, 1)",
    "train.lr = -1.0 must be positive",
    "data.rank = 9 is larger than data.n = 5",
    "model.heads = 3 does not divide model.hidden = 16",
]


def test_several_bad_values_are_named_together():
    with pytest.raises(ConfigError) as e:
        profile_from_dict(SEVERAL)
    assert str(e.value).splitlines() == ["4 bad values:", *(f"  {line}" for line in SEVERAL_LINES)]
    assert e.value.problems == SEVERAL_LINES


def test_wrong_types_unknown_keys_and_ranges_are_named_together():
    raw = {
        "colour": 1,
        "model": {"hedas": 8, "layers": 0},
        "train": {"steps": 2.5, "precision": "fp8"},
        "analysis": [1],
    }
    with pytest.raises(ConfigError) as e:
        profile_from_dict(raw)
    assert e.value.problems == [  # unknown keys first, then the schema's order
        "unknown key model.hedas = 8 (known: " + ", ".join(f.name for f in fields(ModelConfig)) + ")",
        "unknown key colour = 1 (known: " + ", ".join(f.name for f in fields(Profile)) + ")",
        "model.layers = 0 must be positive",
        "train.steps = 2.5 is not an integer",
        "train.precision = 'fp8' is not one of fp32, tf32, bf16",
        "analysis = [1] is not a mapping",
    ]


def test_a_bad_value_is_named_once_not_again_by_the_checks_that_read_it():
    # n = 0 is not also "rank 2 is larger than n 0"; steps = 'x' keeps its default for the
    # checkpoint check, which is not judged on it; heads = 0 is not also "does not divide"
    assert _one_line_error({"data": {"n": 0}}) == "data.n = 0 must be positive"
    assert (
        _one_line_error({"train": {"steps": "x"}, "checkpoints": {"pre": 1, "transition": [2], "post": 3}})
        == "train.steps = 'x' is not an integer"
    )
    assert _one_line_error({"model": {"heads": 0}}) == "model.heads = 0 must be positive"


def test_several_checkpoint_steps_outside_the_run_are_one_line():
    assert (
        _one_line_error({"train": {"steps": 100}})
        == "checkpoints steps 4000, 10000, 14000, 16000, 20000, 50000 are outside 1..train.steps = 100"
    )


def test_many_bad_values_fit_a_screen():
    keys = POSITIVE_INT[:25]
    raw: dict = {}
    for key in keys:
        section, leaf = key.split(".")
        raw.setdefault(section, {})[leaf] = 0
    with pytest.raises(ConfigError) as e:
        profile_from_dict(raw)
    lines = str(e.value).splitlines()
    assert len(e.value.problems) == len(keys) > 20
    assert lines[0] == f"{len(keys)} bad values:" and len(lines) == 22
    assert lines[-1] == f"  ... and {len(keys) - 20} more"


def test_a_file_with_several_bad_values_is_named_once(tmp_path):
    path = tmp_path / "p.yaml"
    message = _load_error(
        path, "data: {n: 5, rank: 9, p_mask: 1.5}\ntrain: {lr: -1}\nmodel: {heads: 3, hidden: 16}\n"
    )
    assert message.splitlines() == [f"{path}: 4 bad values:", *(f"  {line}" for line in SEVERAL_LINES)]


def test_cli_prints_every_bad_value_and_writes_nothing(tmp_path, capsys):
    from mclib.__main__ import main

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: bad\ndata: {n: 5, rank: 9, p_mask: 1.5}\ntrain: {lr: -1}\nmodel: {heads: 3, hidden: 16}\n"
    )
    out = tmp_path / "run"
    assert main(["train", "--profile", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"mclib: error: {bad}: 4 bad values:",
        *(f"  {line}" for line in SEVERAL_LINES),
    ]
    assert not out.exists()


def test_what_is_not_recipe_and_what_may_change_on_resume_come_from_one_list(tmp_path):
    """recipe.RUNNING (how a run is executed) is neither a departure from the paper nor a
    change that stops a folder from resuming; train.steps departs but may grow on resume;
    what the folder records (eval, log and save steps), the attention implementation and
    Adam's kernels are no departure but fixed for the folder."""
    from mclib.core.recipe import RUNNING, deviations
    from mclib.core.runs import check_same_profile, write_profile

    base = paper.profile()
    write_profile(tmp_path, base)
    other = {
        bool: lambda v: not v,
        int: lambda v: v + 1,
        float: lambda v: v * 2,
        str: lambda v: {"auto": "cpu", "steps": "converged"}[v],
    }
    keys = [k for k in RUNNING if hasattr(base.train, k)]
    assert len(keys) >= 6
    for key in keys + ["steps"]:
        v = getattr(base.train, key)
        new = (
            2 * base.train.save_every
            if key == "state_every"  # a multiple of save_every
            else "cuda-graph"
            if key == "step"
            else other[type(v)](v)
        )
        changed = base.replace(**{f"train.{key}": new})
        check_same_profile(tmp_path, changed)  # resumes
        assert [d["key"] for d in deviations(changed, base)] == ([] if key != "steps" else ["train.steps"])
    for key, value in (
        ("train.eval_every", 7),
        ("train.eval_batch", 7),
        ("train.save_every", 500),
        ("train.log_every", 7),
        ("model.attention", "eager"),
        ("train.adam", "fused"),
    ):
        changed = base.replace(**{key: value})
        assert deviations(changed, base) == []
        with pytest.raises(ConfigError, match=f"{key} differs"):
            check_same_profile(tmp_path, changed)
