"""Every environment variable carbonflow reads or sets is named in the docs (a user never has to read the source to
find a setting): the production page's Settings table, the training contract in Bring your own job, or the list of
what carbonflow sets itself."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_carbonflow_variable_in_the_code_is_documented() -> None:
    names = set()
    for path in [*REPO.joinpath("carbonflow").rglob("*.py"), *REPO.joinpath("dags").rglob("*.py")]:
        names |= set(re.findall(r"[\"'](CARBONFLOW_[A-Z0-9_]+)[\"']", path.read_text(encoding="utf-8")))
    assert len(names) > 20, "the scan found too few variables to mean anything"
    docs = "\n".join(p.read_text(encoding="utf-8") for p in REPO.joinpath("docs").glob("*.md"))
    missing = sorted(n for n in names if n not in docs)
    assert not missing, f"document these in docs/production.md's Settings (or own-job.md): {missing}"
