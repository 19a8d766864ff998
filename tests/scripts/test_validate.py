"""``scripts/validate.py``'s doc writer: a run of some consumers keeps the others' tables."""

from __future__ import annotations

from pathlib import Path

import pytest
import validate


def region(*sections: str) -> str:
    return "\n\n".join(sections)


def old_section(consumer: str, text: str) -> str:
    return f"{validate.HEADING}{consumer} in front\n\nabout {text}\n\n| table {text} |"


@pytest.fixture
def doc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "validation.md"
    monkeypatch.setattr(validate, "DOC", path)
    return path


def marked(body: str) -> str:
    return f"# Title\n\nbefore\n\n{validate.BEGIN}\n{body}\n{validate.END}\n\nafter\n"


def test_sections_are_found_by_consumer() -> None:
    text = region(old_section("1.6.1", "a"), old_section("1.7.0.dev20261026", "b"))
    found = validate.sections_by_consumer(text)
    assert list(found) == ["1.6.1", "1.7.0.dev20261026"]
    assert found["1.7.0.dev20261026"].endswith("| table b |")
    assert "table b" not in found["1.6.1"]


def test_a_run_of_one_consumer_keeps_the_other(doc: Path) -> None:
    released, upcoming = validate.CONSUMERS[0], validate.CONSUMERS[1]
    doc.write_text(marked(region(old_section(released, "old"), old_section(upcoming, "old"))))
    validate.write_doc({upcoming: old_section(upcoming, "new")})
    text = doc.read_text()
    assert "| table old |" in text and "| table new |" in text
    assert text.count(validate.HEADING) == 2
    # The released version's table first, whatever ran last; the text around the markers stays.
    assert text.index(f"{validate.HEADING}{released}") < text.index(f"{validate.HEADING}{upcoming}")
    assert text.startswith("# Title\n\nbefore\n\n") and text.endswith("\n\nafter\n")


def test_a_rerun_replaces_its_own_table(doc: Path) -> None:
    released = validate.CONSUMERS[0]
    doc.write_text(marked(old_section(released, "old")))
    validate.write_doc({released: old_section(released, "new")})
    assert "table old" not in doc.read_text()
    assert "| table new |" in doc.read_text()


def test_markers_are_required(doc: Path) -> None:
    doc.write_text("no markers\n")
    with pytest.raises(SystemExit, match="lacks the markers"):
        validate.write_doc({})
