"""Issue 25 finding: docs/energy.md and docs/own-job.md disagreed on what happens without a GPU (one said a
simulated GPU replays Zeus's measurements, the other that the energy is the CPU's, estimated). One page says it
(energy.md, "Without a GPU"); every other page that speaks of running without a GPU links there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "docs" / "energy.md"
ANCHOR = "energy.md#without-a-gpu"
NO_GPU = re.compile(r"\b(without a GPU(?! of its own)|with no GPU|where NVML finds no GPU)\b", re.IGNORECASE)
"""A sentence about a job run where there is no GPU (not "a worker without a GPU of its own", not "no GPU machine")."""
LABEL = re.compile(r"\b(estimated|measured|simulated|RAPL|codecarbon)\b", re.IGNORECASE)
"""...that says what its energy figures are: the statement the two pages disagreed on."""


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _sentences(text: str) -> list[str]:
    """The prose's sentences: code blocks and headings left out, each paragraph split at sentence ends."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    out = []
    for para in re.split(r"\n\s*\n", text):
        prose = " ".join(line for line in para.splitlines() if not line.lstrip().startswith("#"))
        out += re.split(r"(?<=[.!?])\s+(?=[A-Z*`\[])", " ".join(prose.split()))
    return out


def _unlinked(text: str) -> list[str]:
    """Sentences that say what a job's energy is without a GPU, with no link to the one page."""
    return [s for s in _sentences(text) if NO_GPU.search(s) and LABEL.search(s) and ANCHOR not in s]


def test_only_energy_md_describes_what_happens_without_a_gpu() -> None:
    headings = [(p.relative_to(ROOT), line) for p in _pages() for line in p.read_text(encoding="utf-8").splitlines()
                if re.fullmatch(r"#+ (What happens )?(without a GPU|with no GPU)", line, re.IGNORECASE)]  # fmt: skip
    assert headings == [(HOME.relative_to(ROOT), "## Without a GPU")], headings
    section = HOME.read_text(encoding="utf-8").split("## Without a GPU", 1)[1].split("\n## ", 1)[0]
    for must in ("simulated_gpu", "*simulated*", "RAPL", "*estimated*", "power_limit_w"):
        assert must in section, must  # both cases: a simulated GPU, and the CPU alone (measured or estimated)


def test_other_pages_that_speak_of_no_gpu_link_to_the_one_page() -> None:
    unlinked = [
        f"{page.relative_to(ROOT)}: {sentence[:200]}"
        for page in _pages()
        if page != HOME
        for sentence in _unlinked(page.read_text(encoding="utf-8"))
    ]
    assert not unlinked, "say it once in docs/energy.md#without-a-gpu and link there:\n" + "\n".join(unlinked)


def test_own_job_links_to_the_one_page_instead_of_its_own_account() -> None:
    text = (ROOT / "docs" / "own-job.md").read_text(encoding="utf-8")
    assert ANCHOR in text
    assert "Without a GPU the energy is the CPU's" not in text


def test_the_rule_catches_the_old_disagreement() -> None:
    """The rule fails on the sentence own-job.md had (an account of its own, no link), and passes its link."""
    old = "It runs.\nWithout a GPU the energy is the CPU's, **estimated**, and the output says so.\n\n## Next\n"
    assert _unlinked(old) == ["Without a GPU the energy is the CPU's, **estimated**, and the output says so."]
    assert _unlinked((ROOT / "docs" / "own-job.md").read_text(encoding="utf-8")) == []
