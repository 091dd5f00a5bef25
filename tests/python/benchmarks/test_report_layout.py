"""BENCHMARKS.md is written by two writers: bench/run.py (the numbered cases, keeping the sections it finds) and
each section's script (bench/suite/sections.update, keeping everything else). Both go through
sections.compose, so the file comes out byte for byte the same whichever wrote it last: a regenerated section
changes only its own lines. (Before, the full report left two blank lines before the sections' marker and a
section's update one, so every regeneration also moved a blank line.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

from suite import sections  # noqa: E402


def render(out: Path) -> None:
    """bench/run.py re-renders the committed report's numbered cases from bench/results.json into `out`."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "--render", str(ROOT / "bench" /
                          "results.json"), "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def test_a_section_update_after_the_full_report_changes_no_byte(tmp_path: Path) -> None:
    report = tmp_path / "BENCHMARKS.md"
    report.write_text((ROOT / "BENCHMARKS.md").read_text())
    render(report)
    written = report.read_text()
    kept = sections.blocks(written)
    assert sections.MARKER in written and kept, "the committed report has sections to keep"
    for name, body in kept.items():
        sections.update(report, name, body)
        assert report.read_text() == written, name
    render(report)
    assert report.read_text() == written


def test_compose_drops_the_heads_trailing_blank_lines() -> None:
    kept = {"threads": "## T\n", "remote": "## R"}
    expected = "# head\n\n" + sections.MARKER + "\n\n<!-- begin remote -->\n## R\n<!-- end remote -->\n\n" \
        "<!-- begin threads -->\n## T\n<!-- end threads -->\n"
    assert sections.compose("# head", kept) == expected
    assert sections.compose("# head\n\n\n", kept) == expected
