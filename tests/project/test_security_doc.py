"""docs/security.md stays true: every test it cites exists, and every attack kind it names is in the benchmark."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "security.md").read_text(encoding="utf-8")


def _defined_tests() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "tests").rglob("test_*.py"):
        names |= set(re.findall(r"^\s*(?:async\s+)?def (test_\w+)", path.read_text(encoding="utf-8"), re.M))
    return names


def test_every_test_the_security_page_cites_exists():
    cited = set(re.findall(r"`(test_\w+)`", DOC))
    assert len(cited) >= 30
    missing = sorted(cited - _defined_tests())
    assert not missing, f"docs/security.md cites tests that do not exist: {missing}"


def test_every_attack_kind_the_security_page_names_is_in_the_benchmark():
    source = (REPO / "benchmarks" / "attacks.py").read_text(encoding="utf-8")
    kinds = set(re.findall(r'^    "(\w+)": Kind\(', source, re.M))
    named = {k for line in DOC.splitlines() if "attack" in line for k in re.findall(r"`([a-z_]+)`", line)} & kinds
    assert kinds, "no attack kinds found in benchmarks/attacks.py"
    assert named == kinds, f"kinds the page does not name: {sorted(kinds - named)}"
