"""``python -m bench simulate --from-rows``: one run's table from rows saved over several
sittings (a 100 x 365 run takes longer than one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.simulate.main import _from_rows, _parse

ROW = ("{seed} 365 100 50 1000 crash=2 down=1 queue_batches=7 12 {violations} "
       "0123456789abcdef 61.5")


def _rows(path: Path, *seeds: int, violations: int = 0) -> str:
    path.write_text("# a comment\n" + "\n".join(ROW.format(seed=s, violations=violations)
                                               for s in seeds) + "\n")
    return str(path)


def test_rows_of_two_sittings_make_one_table_in_seed_order(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    later = _rows(tmp_path / "b.txt", 3, 4)
    first = _rows(tmp_path / "a.txt", 1, 2)
    assert _from_rows([later, first]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[2:6]] == ["1", "2", "3", "4"]
    total = lines[-1].split()
    assert total[:7] == ["4", "seeds", "1460", "400", "200", "4000", "crash=8"]
    assert "down=4" in total and "queue_batches=28" in total
    assert total[-4:] == ["48", "0", "246.0", "(sum)"]


def test_a_violation_in_the_rows_fails_the_table(tmp_path: Path) -> None:
    assert _from_rows([_rows(tmp_path / "a.txt", 1, violations=1)]) == 1


def test_a_seed_twice_or_rows_of_two_lengths_are_refused(tmp_path: Path) -> None:
    twice = _rows(tmp_path / "a.txt", 1, 2)
    with pytest.raises(SystemExit, match="seed 2 appears twice"):
        _from_rows([twice, _rows(tmp_path / "b.txt", 2)])
    short = tmp_path / "c.txt"
    short.write_text(ROW.format(seed=9, violations=0).replace(" 365 ", " 30 ", 1) + "\n")
    with pytest.raises(SystemExit, match="different lengths"):
        _from_rows([_rows(tmp_path / "d.txt", 1), str(short)])


def test_a_row_that_is_not_one_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "a.txt"
    bad.write_text("1 365 lots\n")
    with pytest.raises(SystemExit, match=r"a.txt:1: not a per-seed row"):
        _from_rows([str(bad)])


def test_options_of_a_run_are_an_error_with_rows(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        _parse(["--from-rows", str(tmp_path / "a.txt"), "--jobs", "2"])
    assert _parse(["--from-rows", "x.txt"]).from_rows == ["x.txt"]


PUBLISHED = Path(__file__).parents[3] / "docs" / "simulation"


def _saved(name: str) -> dict[str, list[str]]:
    lines = (PUBLISHED / name).read_text().splitlines()
    return {line.split()[0]: line.split() for line in lines if line and not line.startswith("#")}


def test_the_published_run_is_100_seeds_of_a_year_without_a_violation(
        capsys: pytest.CaptureFixture[str]) -> None:
    # The README and docs/reliability.md quote this table: it must stay what they say.
    assert _from_rows([str(PUBLISHED / "run-3428b57.txt")]) == 0
    total = capsys.readouterr().out.splitlines()[-1].split()
    assert total[:5] == ["100", "seeds", "36500", "1794895", "942480"]
    assert total[-4:-2] == ["115578", "0"]  # deliveries, violations
    assert sorted(int(seed) for seed in _saved("run-3428b57.txt")) == list(range(1, 101))


RERUNS = sorted(path.name for path in PUBLISHED.glob("rerun-*.txt"))


def test_the_reruns_quoted_by_the_docs_are_there() -> None:
    # seeds 1-20 in the run's second sitting; all 100 on the code after the parser change
    assert {"rerun-3428b57-seeds-1-20.txt", "rerun-2979c28.txt"} <= set(RERUNS)
    assert sorted(_saved("rerun-2979c28.txt"), key=int) == [str(s) for s in range(1, 101)]
    assert sorted(_saved("rerun-3428b57-seeds-1-20.txt"), key=int) == [
        str(seed) for seed in range(1, 21)]


@pytest.mark.parametrize("name", RERUNS)
def test_seeds_run_again_kept_their_histories(name: str) -> None:
    """Another sitting, machine or commit: the same seed gives the same row, wall time
    aside (the digest covers every effect, fault and operator action of the year)."""
    # _from_rows refuses a seed twice, which the dict below would merge silently.
    assert _from_rows([str(PUBLISHED / name)]) == 0
    run, again = _saved("run-3428b57.txt"), _saved(name)
    assert again
    for seed, row in again.items():
        assert row[:-1] == run[seed][:-1], f"seed {seed}: only the wall time may differ"
