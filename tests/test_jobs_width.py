"""`trainctl jobs` fits 80 columns whatever the names (docs/jobs.md): the name column takes what the other
columns leave and a longer name loses its middle; pure functions, no AWS (the command itself: tests/
test_trainctl_handles.py)."""

from __future__ import annotations

from typing import Any

from rich.text import Text

from trainctl.display import elide_middle
from trainctl.inspecting.listing import DEFAULT_COLUMNS, MIN_NAME_WIDTH, table_lines

NOW_MS = 1_800_000_000_000
# 64 characters: an experiment's name as people write them, its end the part that tells runs apart.
LONG = "pretrain-llama-3-8b-fineweb-edu-lr3e-4-warmup2k-bs1024-seed17-v2"


def row(job_id: str, name: str, *, fleet: str = "trainium", state: str = "SUCCEEDED") -> dict[str, Any]:
    return {
        "jobId": job_id,
        "name": name,
        "fleet": fleet,
        "state": state,
        "nodes": 16,
        "createdAt": NOW_MS - 3_600_000,
        "startedAt": None,
        "durationMs": None,
        "attempts": 1,
        "share": None,
        "sweep": None,
        "usdEstimate": None,
    }


def plain(lines: list[str]) -> list[str]:
    """The lines as a terminal shows them (rich markup and colour off)."""
    return [Text.from_markup(line).plain for line in lines]


def test_elide_middle_keeps_the_start_and_the_end_in_exactly_the_width() -> None:
    assert len(LONG) == 64
    cut = elide_middle(LONG, 24)
    assert len(cut) == 24
    assert cut == LONG[:12] + "…" + LONG[-11:]
    assert cut.startswith("pretrain-lla") and cut.endswith("seed17-v2") and cut.count("…") == 1
    # One character less than the name still elides; the name's own length does not.
    assert elide_middle(LONG, 63) == LONG[:31] + "…" + LONG[-31:]
    assert elide_middle(LONG, 64) == LONG
    assert elide_middle("h1-rough", 24) == "h1-rough"
    assert elide_middle("abcdef", 2) == "a…"


def test_a_64_character_name_keeps_every_row_within_80_columns() -> None:
    rows = [row("5f2c81d0-1111-4111-8111-111111111111", LONG), row("9a7b1e22-2222-4222-8222-222222222222", "h1-rough")]
    lines = plain(table_lines(rows, DEFAULT_COLUMNS, now_ms=NOW_MS, fit=80))
    assert all(len(line) <= 80 for line in lines), lines
    long_cells = [line.split()[1] for line in lines[1:]]
    assert long_cells[1] == "h1-rough"  # a short name stays whole
    elided = long_cells[0]
    assert "…" in elided and len(elided) < len(LONG)
    start, end = elided.split("…")
    assert LONG.startswith(start) and LONG.endswith(end) and len(start) >= len(end) >= 8
    # The other columns are whole: the short id, the fleet, the state.
    assert lines[1].split()[0] == "5f2c81d0" and lines[1].split()[2:4] == ["trainium", "SUCCEEDED"]


def test_a_wider_terminal_gives_the_name_its_room_and_no_fit_cuts_nothing() -> None:
    rows = [row("5f2c81d0-1111-4111-8111-111111111111", LONG)]
    assert LONG in plain(table_lines(rows, DEFAULT_COLUMNS, now_ms=NOW_MS, fit=120))[1]
    assert LONG in plain(table_lines(rows, DEFAULT_COLUMNS, now_ms=NOW_MS))[1]


def test_the_name_keeps_a_readable_width_when_the_other_columns_take_the_line() -> None:
    fleet = "a-fleet-whose-name-is-long-enough-to-leave-no-room"
    rows = [row("5f2c81d0-1111-4111-8111-111111111111", LONG, fleet=fleet)]
    name = plain(table_lines(rows, DEFAULT_COLUMNS, now_ms=NOW_MS, fit=80))[1].split()[1]
    assert len(name) == MIN_NAME_WIDTH and name.startswith(LONG[:8]) and name.endswith(LONG[-7:])
