"""Every environment variable carbonflow reads or sets is named in the docs (a user never has to read the source to
find a setting): the production page's Settings table, the training contract in Bring your own job, or the list of
what carbonflow sets itself. The list is :data:`carbonflow.settings.VARIABLES`; ``test_settings_module.py`` checks
that it holds every ``CARBONFLOW_*`` name the code uses."""

from __future__ import annotations

from pathlib import Path

from carbonflow.settings import VARIABLES

REPO = Path(__file__).resolve().parents[2]


def undocumented(names: list[str], docs: str) -> list[str]:
    """The names of ``names`` that ``docs`` never mentions (as a whole name: ``CARBONFLOW_JOB`` is not named by
    ``CARBONFLOW_JOBS_DIR``)."""
    import re

    return sorted(n for n in names if not re.search(rf"(?<![A-Z0-9_]){n}(?![A-Z0-9_])", docs))


def test_every_carbonflow_variable_in_the_settings_list_is_documented() -> None:
    assert len(VARIABLES) > 20, "the settings list is too short to mean anything"
    docs = "\n".join(p.read_text(encoding="utf-8") for p in REPO.joinpath("docs").glob("*.md"))
    missing = undocumented(sorted(VARIABLES), docs)
    assert not missing, f"document these in docs/production.md's Settings (or own-job.md): {missing}"


def test_an_undocumented_variable_is_found() -> None:
    docs = "set `CARBONFLOW_JOBS_DIR` to the folder"
    assert undocumented(["CARBONFLOW_JOBS_DIR", "CARBONFLOW_JOB", "CARBONFLOW_NEW"], docs) == [
        "CARBONFLOW_JOB",
        "CARBONFLOW_NEW",
    ]
