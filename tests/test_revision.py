"""The revision a result names: git's only where the tree is its own repository, else the kit's
record of the tree it was built from, else "unknown"; and, back here, a lease's recorded revision
checked against the hash of the mclib sources that ran (mclib.core.repo, mclib.lease.slices_pack)."""

import json
import subprocess

import pytest

from mclib.core import repo
from mclib.lease import slices
from mclib.lease.slices_pack import true_revision


def _git(folder, *args):
    return subprocess.run(
        ["git", "-C", str(folder), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def tree_inside_another_repository(tmp_path, monkeypatch):
    """A copy of the tree without .git, in a folder of another repository (as a lease's copy sat)."""
    outer = tmp_path / "outer"
    outer.mkdir()
    _git(outer, "init", "-q")
    (outer / "x.txt").write_text("x")
    _git(outer, "add", "x.txt")
    _git(outer, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    tree = outer / "tree"
    tree.mkdir()
    monkeypatch.setattr(repo, "REPO", tree)
    monkeypatch.setattr(repo, "mclib_sha", lambda: "the-sources-that-run")
    monkeypatch.delenv(repo.KIT_ENV, raising=False)
    return tree, _git(outer, "rev-parse", "--short", "HEAD")


def test_a_tree_without_its_own_git_never_takes_the_revision_of_the_repository_around_it(
    tree_inside_another_repository,
):
    tree, outer_rev = tree_inside_another_repository
    assert repo.git_revision() == "unknown"
    assert outer_rev not in repo.git_revision()


def test_such_a_tree_takes_the_kits_revision_only_where_the_kit_was_built_from_the_same_sources(
    tree_inside_another_repository, monkeypatch
):
    tree, _ = tree_inside_another_repository
    (tree / ".kit").mkdir()
    record = tree / ".kit" / repo.KIT_RECORD
    record.write_text(json.dumps({"git": "50947b2", "mclib": "the-sources-that-run"}))
    assert repo.git_revision() == "50947b2"
    record.write_text(json.dumps({"git": "50947b2", "mclib": "other-sources"}))
    assert repo.git_revision() == "unknown"
    (tree / "kit-elsewhere").mkdir()
    (tree / "kit-elsewhere" / repo.KIT_RECORD).write_text(
        json.dumps({"git": "abc1234", "mclib": "the-sources-that-run"})
    )
    monkeypatch.setenv(repo.KIT_ENV, "kit-elsewhere")  # scripts/lease.sh names the kit it installed
    assert repo.git_revision() == "abc1234"


def test_a_recorded_revision_that_is_no_commit_here_is_merged_as_unknown_with_the_commits_whose_sources_ran():
    head = repo.commit("HEAD")
    ran = repo.tree_mclib_sha(head)
    assert repo.commit("0000000") is None
    revision, note = true_revision("0000000", ran)
    assert revision == "unknown"
    assert "not a commit of this repository" in note and head in note and note.endswith("revision unknown")
    assert true_revision(head, ran) == (head, None)  # a revision that is right stands, silently
    revision, note = true_revision(head, "0123456789abcdef")  # a commit, but not the sources that ran
    assert revision == "unknown" and "not the ones that ran" in note


def test_a_revision_given_to_merge_is_taken_only_where_its_sources_hash_to_those_that_ran():
    head = repo.commit("HEAD")
    ran = repo.tree_mclib_sha(head)
    revision, note = true_revision("bd30609", ran, given=head)
    assert revision == head and "given to merge" in note and ran in note
    with pytest.raises(
        slices.SliceError, match=r"--revision .*: its mclib sources hash to .*, the lease ran 0123"
    ):
        true_revision("bd30609", "0123456789abcdef", given=head)
    with pytest.raises(slices.SliceError, match="is not a commit of this repository"):
        true_revision("bd30609", ran, given="no-such-revision")


def test_the_sources_hash_read_from_git_is_the_one_the_tree_gives_where_nothing_changed(tmp_path):
    head = repo.commit("HEAD")
    dirty = _git(repo.REPO, "status", "--porcelain", "--untracked-files=no", "--", "mclib")
    if dirty:
        pytest.skip("mclib/ has uncommitted changes here")
    assert repo.tree_mclib_sha(head) == repo.mclib_sha()
    assert head in repo.revisions_of_mclib(repo.mclib_sha(), commits=5)
