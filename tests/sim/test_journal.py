"""A campaign's journal: it goes on after its last chunk, refuses other code or faults, and
its summary sums every chunk and sitting."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from toolfleet.testing.sim import FAULT_KINDS, run
from toolfleet.testing.sim.__main__ import main
from toolfleet.testing.sim._campaign import Campaign
from toolfleet.testing.sim._journal import Journal, JournalError, campaign, runs_on

HOLDING = frozenset(FAULT_KINDS) - {"failover"}
ON = {
    "code": "c0de" * 16,
    "python": "3.11.7",
    "engine": {"fakeredis": "2", "lupa": "2", "redis": "5"},
    "hash_seed": "0",
}


class Killed(Exception):
    """Stands for the process being killed mid-campaign."""


def _chunk(seeds: int, steps: int, failed: dict[int, list[str]] | None = None) -> Campaign:
    return Campaign(
        seeds=seeds,
        steps=steps,
        faults=Counter({"crash": seeds}),
        states=Counter({"turn completed": 2 * seeds}),
        failed=failed or {},
    )


def test_a_campaign_cut_short_goes_on_after_its_last_recorded_chunk(tmp_path: Path) -> None:
    path = tmp_path / "campaign.jsonl"

    def killed_in_the_second_chunk(journal: Journal, chunk: Campaign) -> None:
        if journal.done.seeds == 2 and chunk.seeds == 1:
            raise Killed

    journal = Journal.open(path, first=3, seeds=5, faults=HOLDING)
    with pytest.raises(Killed):
        campaign(journal, jobs=2, chunk=2, progress=killed_in_the_second_chunk)
    with path.open("ab") as torn:  # and killed while writing a line
        torn.write(b'{"first":5,"seeds":2,"st')

    journal = Journal.open(path, first=3, seeds=5, faults=HOLDING)
    assert (journal.done.seeds, journal.next_seed, len(journal.sittings)) == (2, 5, 1)
    campaign(journal, jobs=2, chunk=2)

    assert path.read_bytes().endswith(b"\n")
    journal = Journal.open(path, first=3, seeds=5, faults=HOLDING)
    journal.close()
    assert journal.complete and [s.seeds for s in journal.sittings] == [2, 3]
    whole = run(3, 5, jobs=2, faults=HOLDING)
    assert journal.done.to_json() == whole.to_json()


def test_a_journal_of_other_code_faults_or_seeds_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "campaign.jsonl"
    Journal.open(path, first=1, seeds=4, faults=HOLDING, on=ON).close()
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"on": {**ON, "code": "beef" * 16}}, "written by other code"),
        ({"on": {**ON, "engine": {**ON["engine"], "lupa": "3"}}}, "written with engine"),
        ({"faults": None}, "run it with those \\(--faults\\)"),
        ({"seeds": 5}, "run it with --first 1 --seeds 4"),
    ]
    for change, message in refusals:
        arguments: dict[str, Any] = {"first": 1, "seeds": 4, "faults": HOLDING, "on": ON}
        with pytest.raises(JournalError, match=message):
            Journal.open(path, **{**arguments, **change})
    journal = Journal.open(path, first=1, seeds=4, faults=HOLDING, on=ON)
    with pytest.raises(JournalError, match="another campaign is writing"):
        Journal.open(path, first=1, seeds=4, faults=HOLDING, on=ON)
    journal.close()


def test_a_damaged_journal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "campaign.jsonl"
    journal = Journal.open(path, first=1, seeds=4, faults=HOLDING, on=ON)
    journal.begin(jobs=1)
    journal.record(_chunk(2, 10), wall_s=1.0)
    journal.close()
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join([*lines[:2], lines[2].replace(b'"first":1', b'"first":2')]))
    with pytest.raises(JournalError, match="records seeds from 2, not 1: the journal is damaged"):
        Journal.open(path, first=1, seeds=4, faults=HOLDING, on=ON)


def test_a_file_that_is_no_journal_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"first line\nno newline at the end")
    with pytest.raises(JournalError, match="is not a simulator campaign's journal"):
        Journal.open(path, first=1, seeds=4, faults=HOLDING, on=ON)
    assert path.read_bytes() == b"first line\nno newline at the end"


def test_a_header_cut_short_is_written_again(tmp_path: Path) -> None:
    path = tmp_path / "campaign.jsonl"
    path.write_bytes(b'{"journal":"toolfleet simulator campaign","vers')
    Journal.open(path, first=1, seeds=4, faults=HOLDING, on=ON).close()
    journal = Journal.open(path, first=1, seeds=4, faults=HOLDING, on=ON)
    journal.close()
    assert journal.next_seed == 1 and len(path.read_bytes().splitlines()) == 1


def test_the_summary_sums_every_chunk_and_sitting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "campaign.jsonl"
    faults = frozenset({"crash"})
    journal = Journal.open(path, first=11, seeds=5, faults=faults)
    journal.begin(jobs=2)
    journal.record(_chunk(2, 100, {12: ["a turn emitted twice"]}), wall_s=5.0)
    journal.close()
    journal = Journal.open(path, first=11, seeds=5, faults=faults)
    journal.begin(jobs=1)
    journal.record(_chunk(2, 300), wall_s=4.0)
    journal.record(_chunk(1, 50, {15: ["a slot held"]}), wall_s=7.5)
    journal.close()

    journal = Journal.open(path, first=11, seeds=5, faults=faults)
    journal.close()
    assert journal.complete
    assert journal.done.to_json() == {
        "seeds": 5,
        "steps": 450,
        "faults": {"crash": 5},
        "states": {"turn completed": 10},
        "failed": {"12": ["a turn emitted twice"], "15": ["a slot held"]},
    }
    assert [(s.seeds, s.wall_s, s.jobs) for s in journal.sittings] == [(2, 5.0, 2), (3, 7.5, 1)]

    monkeypatch.setenv("PYTHONHASHSEED", "0")  # else main would exec a new interpreter
    argv = ["--first", "11", "--seeds", "5", "--faults", "crash", "--journal", str(path)]
    assert main(argv) == 1  # nothing left to run: the journal's summary
    out = capsys.readouterr().out
    assert "5 seeds (from seed 11) recorded in" in out and "in 2 sittings" in out
    assert "sitting 2, began " in out and ": 3 seeds in 8 s on 1 processes" in out
    assert "faults injected: crash 5" in out
    assert "seed 15 failed: a slot held" in out
    replay = "replay: PYTHONHASHSEED=0 python -m toolfleet.testing.sim --seed 12 --faults crash"
    assert replay in out


def test_the_header_names_the_code_the_python_and_the_engine() -> None:
    on = runs_on()
    assert len(on["code"]) == 64 and on["python"].startswith("3.")
    assert set(on["engine"]) == {"fakeredis", "lupa", "redis"}


def test_the_command_line_says_why_it_refuses_a_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "campaign.jsonl"
    Journal.open(path, first=1, seeds=4, faults=frozenset({"crash"}), on=ON).close()
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # else main would exec a new interpreter
    argv = ["--seeds", "4", "--faults", "crash", "--journal", str(path)]
    assert main(argv) == 2
    assert "written by other code" in capsys.readouterr().err
