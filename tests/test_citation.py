"""CITATION.cff: valid Citation File Format 1.2.0, citing the book and,
as a reference, the paper it reproduces, with the paper's facts as docs/protocol.md has them."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

# CFF 1.2.0's required keys and every key it allows at the top level
# (https://github.com/citation-file-format/citation-file-format/blob/1.2.0/schema-guide.md)
REQUIRED = {"cff-version", "message", "title", "authors"}
ALLOWED = REQUIRED | {
    "abstract",
    "commit",
    "contact",
    "date-released",
    "doi",
    "identifiers",
    "keywords",
    "license",
    "license-url",
    "preferred-citation",
    "references",
    "repository",
    "repository-artifact",
    "repository-code",
    "type",
    "url",
    "version",
}


def _cff() -> dict:
    return yaml.safe_load((ROOT / "CITATION.cff").read_text())


def _names_someone(author: dict) -> bool:
    """A CFF person has family-names, an entity a name."""
    return bool(author.get("family-names") or author.get("name"))


def test_citation_file_has_the_required_keys():
    cff = _cff()
    assert REQUIRED <= set(cff) <= ALLOWED, (REQUIRED - set(cff), set(cff) - ALLOWED)
    assert cff["cff-version"] == "1.2.0" and cff.get("type", "software") in ("software", "dataset")
    assert isinstance(cff["message"], str) and cff["message"].strip()
    assert isinstance(cff["title"], str) and cff["title"].strip()
    assert cff["authors"] and all(_names_someone(a) for a in cff["authors"])


def test_the_book_s_title_and_version_are_its_own():
    cff, config = _cff(), yaml.safe_load((ROOT / "_config.yml").read_text())
    assert cff["title"] == config["title"]
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert str(cff["version"]) == version


def test_the_paper_it_reproduces_is_a_reference_with_the_protocol_s_facts():
    (paper,) = [r for r in _cff()["references"] if r["title"].startswith("Abrupt Learning in Transformers")]
    protocol = (ROOT / "docs" / "protocol.md").read_text()
    # docs/protocol.md: "Gopalani, Lubana & Hu, *Abrupt Learning in Transformers: A Case Study on Matrix
    # Completion* (NeurIPS 2024; [arXiv 2410.22244](https://arxiv.org/abs/2410.22244))"
    title = re.search(r"\*(Abrupt Learning in Transformers:[^*]+)\*", protocol).group(1)
    assert paper["title"] == " ".join(title.split())
    arxiv = re.search(r"arXiv (\d{4}\.\d{5})\]\((https://arxiv.org/abs/\S+?)\)", protocol)
    assert paper["url"] == arxiv.group(2) and arxiv.group(1) in paper["url"]
    assert [a["family-names"] for a in paper["authors"]] == ["Gopalani", "Lubana", "Hu"]
    assert "Gopalani, Lubana & Hu" in protocol and "NeurIPS 2024" in protocol
    assert (
        paper["type"] == "conference-paper"
        and paper["year"] == 2024
        and "NeurIPS 2024" in paper["collection-title"]
    )
    assert all(_names_someone(a) for a in paper["authors"])
