"""The mutant catalog (bench/mutate/catalog.toml) cannot rot: every entry's find text
occurs exactly once in its product file, every file is product code, and a mutant is
applied to a copy of the tree, never to the checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.mutate.catalog import ROOT, CatalogError, check, load
from bench.mutate.main import copy_tree, scratch_tree


def test_every_mutant_finds_its_code_exactly_once_in_product_code() -> None:
    mutants = load()
    assert len(mutants) >= 30  # issue 36: at least thirty
    assert check(mutants) == []
    assert all(m.file.startswith("shared/sluice/") for m in mutants)
    areas = {m.file.split("/")[2] for m in mutants}
    assert {"delivery", "billing", "erasure", "alerts", "queues"} <= areas


@pytest.mark.parametrize(("text", "error"), [
    (('[[mutant]]\nid = "a"\nfile = "shared/sluice/x.py"\nfind = ""\nreplace = "y"\n'
     'breaks = "z"\n'), "missing or empty ['find']"),
    (('[[mutant]]\nid = "a"\nfile = "bench/simulate/engine.py"\nfind = "x"\nreplace = "y"\n'
     'breaks = "z"\n'), "is not product code"),
    (('[[mutant]]\nid = "a"\nfile = "shared/sluice/x.py"\nfind = "x"\nreplace = "x"\n'
     'breaks = "z"\n'), "changes nothing"),
    (('[[mutant]]\nid = "a"\nfile = "shared/sluice/x.py"\nfind = "x"\nreplace = "y"\n'
     'breaks = "z"\nextra = 1\n'), "unknown ['extra']"),
    (('[[mutant]]\nid = "a"\nfile = "shared/sluice/../../bench/x.py"\nfind = "x"\n'
     'replace = "y"\nbreaks = "z"\n'), "is not product code"),
])
def test_a_malformed_catalog_entry_is_refused(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=error.replace("[", r"\[").replace("]", r"\]")):
        load(path)


def test_a_find_text_that_moved_is_reported(tmp_path: Path) -> None:
    mutant = load()[0]
    copy = tmp_path / "tree"
    (copy / mutant.file).parent.mkdir(parents=True)
    (copy / mutant.file).write_text("# the code moved\n")
    assert check([mutant], copy) == [
        f"{mutant.id}: its find text occurs 0 times in {mutant.file} (exactly once wanted)"]


def test_a_mutant_edits_a_scratch_copy_and_never_the_checkout(tmp_path: Path) -> None:
    mutant = load()[0]
    before = (ROOT / mutant.file).read_text()
    base = tmp_path / "base"
    copy_tree(ROOT, base)
    with scratch_tree(base, mutant) as root:
        assert mutant.replace in (root / mutant.file).read_text()
        assert not (root / "shared" / "sluice" / "__pycache__").exists()
    assert (ROOT / mutant.file).read_text() == before
    assert (base / mutant.file).read_text() == before
