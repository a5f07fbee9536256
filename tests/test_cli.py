"""One way to set a parameter on the command line: --profile, --set KEY=VALUE, --out; the
older spellings --params and --out-dir still work and say so; a bad key or value is one line
naming where it came from (the file or --set), the key and the value, and nothing is trained
or written."""

import argparse

import pytest
import yaml

import mclib.core.train
from mclib.__main__ import COMMANDS, main, parser
from mclib.core.config import ConfigError, load_profile, parse_setting, profile_path


class Trained(Exception):
    """Raised by the stand-in for `train`: the profile the command would have trained."""


@pytest.fixture
def trained(monkeypatch):
    def fake(profile, run_dir, **kwargs):
        raise Trained(profile, run_dir)

    monkeypatch.setattr(mclib.core.train, "train", fake)


def _options(name: str) -> dict[str, argparse.Action]:
    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return {o: a for a in sub._actions for o in a.option_strings}


@pytest.mark.parametrize("command, default", [("train", "cpu"), ("book", "cpu"), ("solvers", "paper")])
def test_every_command_that_reads_a_profile_has_profile_and_set(command, default):
    options = _options(command)
    assert {"--profile", "--set", "--out"} <= set(options)
    assert options["--profile"].default == default and options["--set"].default == []


def test_the_older_spellings_are_aliases_that_say_so(capsys):
    args = parser().parse_args(["train", "--params", "smoke", "--out-dir", "somewhere"])
    assert (args.profile, args.out) == ("smoke", "somewhere")
    assert capsys.readouterr().err.splitlines() == [
        "mclib: note: --params is an alias of --profile",
        "mclib: note: --out-dir is an alias of --out",
    ]
    args = parser().parse_args(["book", "--profile", "smoke", "--out", "o"])
    assert (args.profile, args.out) == ("smoke", "o") and capsys.readouterr().err == ""
    assert parser().parse_args(["slice", "status"]).out == "slice-work"  # --out's default, not the alias's


def test_the_older_spellings_still_train_where_they_say(trained, tmp_path, capsys):
    with pytest.raises(Trained) as e:
        main(["train", "--params", "smoke", "--out-dir", str(tmp_path / "run")])
    profile, run_dir = e.value.args
    assert profile == load_profile(profile_path("smoke")) and run_dir == tmp_path / "run"
    assert "--params is an alias of --profile" in capsys.readouterr().err


def test_closed_options_list_their_choices():
    assert set(_options("export")["--to"].choices) == {"tensorboard", "wandb"}
    assert set(_options("book")["--device"].choices) == {"auto", "cpu", "cuda"}
    for name in COMMANDS:  # an option that names its values in its help offers them as choices
        for option, action in _options(name).items():
            if action.help and action.help.startswith("the tracker"):
                assert action.choices, (name, option)


@pytest.mark.parametrize(
    "text, key, value",
    [
        ("train.lr=1e-3", "train.lr", 1e-3),  # YAML 1.1 reads 1e-3 as a string; a number here
        ("train.lr=1.0e-3", "train.lr", 1e-3),
        ("train.steps=200", "train.steps", 200),
        ("train.compile=true", "train.compile", True),
        ("analysis.seeds=[1, 2]", "analysis.seeds", [1, 2]),
        ("notes=a=b", "notes", "a=b"),  # the first = splits
        ("analysis.after_drop=null", "analysis.after_drop", None),
        ("name=1e3x", "name", "1e3x"),
    ],
)
def test_a_setting_is_a_dotted_key_and_a_yaml_value(text, key, value):
    got = parse_setting(text)
    assert got == (key, value) and type(got[1]) is type(value)


@pytest.mark.parametrize("text", ["trainlr", "=3", "train.lr=[1"])
def test_a_setting_that_is_not_key_value_is_refused_by_argparse(text, capsys):
    with pytest.raises(ConfigError):
        parse_setting(text)
    with pytest.raises(SystemExit) as e:
        parser().parse_args(["train", "--set", text])
    assert e.value.code == 2 and f"argument --set: {text!r}" in capsys.readouterr().err


def test_set_seed_and_steps_reach_the_profile_trained(trained, tmp_path):
    out = tmp_path / "run"
    with pytest.raises(Trained) as e:
        main(
            [
                "train",
                "--profile",
                "smoke",
                "--set",
                "train.lr=2e-3",
                "--set",
                "model.attention=eager",
                "--seed",
                "7",
                "--steps",
                "90",
                "--out",
                str(out),
            ]
        )
    profile, run_dir = e.value.args
    base = load_profile(profile_path("smoke"))
    assert profile == base.replace(
        **{"train.lr": 2e-3, "model.attention": "eager", "seed": 7, "train.steps": 90}
    )
    assert run_dir == out and profile.train.lr != base.train.lr


@pytest.mark.parametrize(
    "setting, line",
    [
        ("train.lrr=1e-3", "--set: unknown key train.lrr = 0.001 (known: steps, until, "),
        ("trian.lr=1e-3", "--set: unknown key trian.lr = 0.001 (known: name, seed, data, "),
        ("train.steps=many", "--set: train.steps = 'many' is not an integer"),
        ("data.p_mask=1.5", "--set: data.p_mask = 1.5 is outside [0, 1)"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it_and_nothing_is_trained(trained, tmp_path, capsys, setting, line):
    out = tmp_path / "run"
    assert main(["train", "--profile", "smoke", "--set", setting, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"mclib: error: {line}")
    assert not out.exists()


def test_a_misspelt_key_in_a_profile_file_names_the_file_the_key_and_the_value(trained, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ntrain: {stpes: 10}\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / "kept.txt").write_text("mine")
    assert main(["train", "--profile", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        f"mclib: error: {bad}: unknown key train.stpes = 10 (known: "
    )
    assert [p.name for p in out.iterdir()] == ["kept.txt"]  # nothing overwritten


def test_solvers_reads_the_profile_with_its_settings(monkeypatch, tmp_path):
    import mclib.chapters.ch06_baselines as ch06

    seen = []
    monkeypatch.setattr(ch06, "build_solver_cache", lambda profile, out: seen.append((profile, out)))
    assert (
        main(
            [
                "solvers",
                "--profile",
                "smoke",
                "--set",
                "analysis.solver_matrices=8",
                "--out",
                str(tmp_path / "s.csv.gz"),
            ]
        )
        == 0
    )
    assert seen[0][0].analysis.solver_matrices == 8 and seen[0][1] == str(tmp_path / "s.csv.gz")


def test_the_book_hands_its_chapters_the_profile_with_the_settings_on(monkeypatch, tmp_path):
    """book --set: the chapters' kernels read the profile from a file, so the build writes the
    profile with the settings on it and hands the chapters that file."""
    from mclib.book import runner

    seen = {}

    class Build:
        def __init__(self, cfg, out, run_dir, *, params, **kwargs):
            seen.update(cfg=cfg, params=params)

        def execute(self):
            pass

        def no_site(self):
            return {}

    monkeypatch.setattr(runner, "_Build", Build)
    out = tmp_path / "out"
    assert (
        main(
            [
                "book",
                "--profile",
                "smoke",
                "--set",
                "train.lr=3e-3",
                "--seed",
                "4",
                "--out",
                str(out),
                "--chapters",
                "01_train",
                "--no-site",
            ]
        )
        == 0
    )
    written = out / "book" / "_executed" / "smoke-set.yaml"
    assert seen["params"]["profile"] == str(written) and seen["params"]["seed"] == 4
    assert (
        load_profile(written)
        == seen["cfg"]
        == load_profile(profile_path("smoke")).replace(**{"train.lr": 3e-3, "seed": 4})
    )
    assert yaml.safe_load(written.read_text())["train"]["lr"] == 3e-3
