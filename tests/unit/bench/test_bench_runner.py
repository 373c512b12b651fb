"""The shared benchmark runner: ratios, the table, and carrying on past a broken module."""

from __future__ import annotations

import json
import sys
import types

import pytest

from bench.__main__ import main
from bench.common import median_time, row


def test_row_ratio_is_how_many_times_better_sluice_is() -> None:
    assert row("t", sluice=2.0, baseline=6.0, unit="s", higher_is_better=False)["ratio"] == 3.0
    assert row("r", sluice=50.0, baseline=10.0, unit="ops/s", higher_is_better=True)["ratio"] == 5.0
    assert row("n", 1.0, 1.0, "s", False, note="why")["note"] == "why"


def test_median_time_runs_setup_untimed() -> None:
    calls: list[str] = []
    median_time(lambda: calls.append("run"), repeat=3, warmup=1, setup=lambda: calls.append("setup"))
    assert calls == ["setup", "run"] * 4


def test_runner_prints_rows_and_fails_at_the_end_on_a_broken_module(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ok = types.ModuleType("bench.fake_ok")
    ok.run = lambda: [row("fake thing", 1.0, 4.0, "ms", False)]  # type: ignore[attr-defined]
    broken = types.ModuleType("bench.fake_broken")

    def explode() -> list[dict[str, object]]:
        raise RuntimeError("boom")

    broken.run = explode  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bench.fake_ok", ok)
    monkeypatch.setitem(sys.modules, "bench.fake_broken", broken)

    code = main(["fake_broken", "no_such_bench", "fake_ok"])

    out, err = capsys.readouterr()
    assert code == 1
    assert "fake thing" in out and "4.00x" in out
    assert "fake_broken: FAILED" in err and "boom" in err
    assert "no_such_bench: FAILED" in err
    assert main(["fake_ok"]) == 0


def test_json_prints_only_the_rows_as_a_list_on_stdout(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    ok = types.ModuleType("bench.fake_ok")

    def produce() -> list[dict[str, object]]:
        print("a log line the code under test prints")
        return [row("fake thing", 2.0, 4.0, "ms", False, note="n")]

    ok.run = produce  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bench.fake_ok", ok)

    assert main(["fake_ok", "--json"]) == 0

    out, err = capfd.readouterr()
    assert json.loads(out) == [{"benchmark": "fake thing", "sluice": 2.0, "baseline": 4.0,
                                "unit": "ms", "ratio": 2.0}]
    assert "a log line" in err and "2.00x" in err  # logs and the table go to stderr


def test_json_is_strict_a_ratio_against_a_zero_baseline_is_null(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    warm = types.ModuleType("bench.fake_warm")
    warm.run = lambda: [row("parsed on a warm tick", 0.0, 100.0, "bytes", False),  # type: ignore[attr-defined]
                        row("answered 304", 200, 0, "requests", True)]
    monkeypatch.setitem(sys.modules, "bench.fake_warm", warm)

    assert main(["fake_warm", "--json"]) == 0

    out, _ = capfd.readouterr()
    assert "Infinity" not in out and "NaN" not in out
    rows = json.loads(out, parse_constant=lambda name: pytest.fail(f"non-JSON {name}"))
    assert [r["ratio"] for r in rows] == [None, None]
