import pytest
import torch

from mclib.__main__ import main
from mclib.core.config import load_profile, profile_path
from mclib.core.train import train


@pytest.fixture(scope="session")
def smoke_profile():
    return load_profile(profile_path("smoke"))


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, smoke_profile):
    """A trained smoke run (seconds): checkpoints at the profile's pre/transition/post steps."""
    run_dir = tmp_path_factory.mktemp("smoke_run")
    train(smoke_profile, run_dir, progress=False)
    return run_dir


@pytest.fixture(scope="module")
def ch(smoke_run, smoke_profile):
    """The smoke run opened as a chapter (`open_chapter`), one per test module, so that a
    module's checkpoints load once and no module sees another's cached models."""
    from mclib.book.chapter import open_chapter
    return open_chapter("smoke", smoke_profile.seed, smoke_run, "cpu")


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The smoke book, built once for the session (tests/test_book.py, test_book_browser.py):
    OUT/book/_executed/, OUT/_build/html/, OUT/runs/smoke-seed1/."""
    out = tmp_path_factory.mktemp("book")
    assert main(["book", "--profile", "smoke", "--out-dir", str(out)]) == 0
    return out
