"""Issue 25, "Docs that agree": a docs test runs every command shown in Getting started and Bring your own job on a
fresh home, as a user who followed the install step would: in a new folder outside the repository, with a fresh
``CARBONFLOW_HOME`` and ``HOME``, none of the test session's Airflow, MLflow or carbonflow settings, and the venv's
``bin`` first on ``PATH`` (what ``source .venv/bin/activate`` does).

What runs, read from the markdown itself so the docs and the test cannot drift:

- every command of a fenced ``bash``, ``sh``, ``shell`` or ``console`` block, in page order (a ``console`` block's
  commands are its ``$ `` lines, the rest is output); a line ending in ``\\`` and a heredoc's body belong to their
  command. Each must exit 0, or the status its own comment states (``# exits 2``).
- a file the page tells the user to create: any other fenced block whose first line is a comment naming a file
  (``# project/train.py``) is written there, verbatim, before the commands that follow it. Heredocs in a shell block
  create their files by running.
- a block right after ``<!-- docs-test: skip (reason) -->`` is not run: a command that runs until stopped (a server),
  or an install from the network (the test's already-installed venv stands for it; the reason says so).

All commands of one page run in one bash, in order, so a ``cd`` or an ``export`` carries on as in the user's shell.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = ("getting-started.md", "own-job.md")
VENV_BIN = Path(sys.executable).parent
"""The venv the tests run under: the one the install step made."""
SHELLS = {"bash", "sh", "shell", "console"}
SKIP = re.compile(r"^\s*<!--\s*docs-test:\s*skip\s*\((?P<reason>[^)]*\S[^)]*)\)\s*-->\s*$")
ANY_MARK = re.compile(r"docs-test:", re.IGNORECASE)
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
FILE_LABEL = re.compile(r"^\s*(?:#|//)\s*(?P<path>[\w.-]+(?:/[\w.-]+)*\.(?:py|ya?ml|json|toml|cfg|txt|sh|csv))\s*$")
EXPECTED = re.compile(r"#.*\bexits?\s+(?:with\s+)?(?:status\s+)?(?P<rc>\d+)\b")
HEREDOC = re.compile(r"<<(?P<dash>-?)\s*(?P<q>['\"]?)(?P<word>[A-Za-z_][\w-]*)(?P=q)")


@dataclass(frozen=True)
class Step:
    """One thing the page tells the user to do: run a command, or create a file."""

    where: str  # page:line, for the failure message
    command: str = ""
    expected_rc: int = 0
    path: str = ""  # a file to create ...
    content: str = ""  # ... with this text


@dataclass(frozen=True)
class Skipped:
    where: str
    reason: str
    text: str


def _blocks(markdown: str, page: str):  # type: ignore[no-untyped-def]
    """(line number, language, first-line-of-info, body lines, skip reason or None) of each fenced block."""
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, fence, info = opened["indent"], opened["fence"], opened["info"].strip()
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        skip = SKIP.match(before)
        if ANY_MARK.search(before) and not skip:
            raise ValueError(f"{page}:{i}: write the mark as <!-- docs-test: skip (reason) -->, not {before.strip()!r}")
        body, j = [], i + 1
        while j < len(lines) and not (
            lines[j].strip().startswith(fence[0] * len(fence)) and set(lines[j].strip()) == {fence[0]}
        ):
            line = lines[j]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            j += 1
        language = info.split()[0].lstrip(".{").lower() if info else ""
        yield i + 1, language, body, (skip["reason"].strip() if skip else None)
        i = j + 1


def _commands(body: list[str], console: bool) -> list[tuple[int, str]]:
    """(offset in the block, command) for each command of a shell block."""
    out: list[tuple[int, str]] = []
    k = 0
    while k < len(body):
        line = body[k]
        if console:
            if not line.startswith("$ "):
                k += 1
                continue
            line = line[2:]
        if not line.strip() or line.lstrip().startswith("#"):
            k += 1
            continue
        start, parts = k, [line]
        while parts[-1].endswith("\\") and k + 1 < len(body):
            k += 1
            parts.append(body[k][2:] if console and body[k].startswith("> ") else body[k])
        for heredoc in HEREDOC.finditer("\n".join(parts)):
            word, dash = heredoc["word"], heredoc["dash"]
            while k + 1 < len(body):
                k += 1
                parts.append(body[k])
                if (body[k].lstrip("\t") if dash else body[k]) == word:
                    break
            else:
                raise ValueError(f"heredoc {word!r} is not closed in its block")
        out.append((start, "\n".join(parts)))
        k += 1
    return out


def extract(markdown: str, page: str = "page.md") -> tuple[list[Step], list[Skipped]]:
    """The steps of a page, in order, and the blocks it marks as not run here."""
    steps: list[Step] = []
    skipped: list[Skipped] = []
    for line, language, body, reason in _blocks(markdown, page):
        where = f"{page}:{line}"
        if reason is not None:
            skipped.append(Skipped(where, reason, "\n".join(body)))
            continue
        if language in SHELLS:
            for offset, command in _commands(body, console=language == "console"):
                first = command.splitlines()[0]
                expected = EXPECTED.search(first)
                steps.append(Step(f"{page}:{line + 1 + offset}", command, int(expected["rc"]) if expected else 0))
        elif body and (label := FILE_LABEL.match(body[0])):
            steps.append(Step(where, path=label["path"], content="\n".join(body) + "\n"))
    return steps, skipped


def user_env(home: Path, carbonflow_home: Path) -> dict[str, str]:
    """A user's shell after the install step: the venv first on PATH, nothing of this test session's settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AIRFLOW", "CARBONFLOW", "MLFLOW", "PYTEST", "VIRTUAL_ENV", "PYTHON"))
    }
    env.update(
        PATH=f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        VIRTUAL_ENV=str(VENV_BIN.parent),
        HOME=str(home),
        CARBONFLOW_HOME=str(carbonflow_home),
        COLUMNS="160",
    )
    return env


@dataclass(frozen=True)
class Outcome:
    failed: str  # "" when every step did what the page says; else the step and its exit status
    ran: int  # commands that ran
    output: str


def run_steps(steps: list[Step], work: Path, env: dict[str, str], timeout: float) -> Outcome:
    """Run the page's steps in one bash, in order, in ``work``; stop at the first command that exits otherwise."""
    staging = work.parent / f".{work.name}-docs-test"
    staging.mkdir(parents=True, exist_ok=True)
    status = staging / "status"
    script = ["cd " + shlex.quote(str(work))]
    for n, step in enumerate(steps):
        if step.path:
            source = staging / f"file-{n}"
            source.write_text(step.content, encoding="utf-8")
            target = shlex.quote(step.path)
            script += [f'mkdir -p "$(dirname {target})" && cp {shlex.quote(str(source))} {target}']
            continue
        shown = shlex.quote(f"\n+++ {step.where}: {step.command.splitlines()[0]}")
        report = shlex.quote(f"{step.where}: `{step.command.splitlines()[0]}` exited ")
        script += [
            f"printf '%s\\n' {shown}",
            step.command,
            "__rc=$?",
            f"echo {n} >> {shlex.quote(str(status))}.ran",
            f'if [ "$__rc" != {step.expected_rc} ]; then'
            f" printf '%s%s, expected {step.expected_rc}\\n' {report} \"$__rc\" > {shlex.quote(str(status))};"
            " exit 97; fi",
        ]
    (staging / "steps.sh").write_text("\n".join(script) + "\n", encoding="utf-8")
    done = subprocess.run(
        ["bash", str(staging / "steps.sh")],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    failed = status.read_text().strip() if status.exists() else ""
    if not failed and done.returncode != 0:
        failed = f"the page's steps ended with exit status {done.returncode}"
    ran_file = Path(f"{status}.ran")
    ran = len(ran_file.read_text().split()) if ran_file.exists() else 0
    return Outcome(failed, ran, done.stdout)


def run_page(markdown: str, page: str, tmp_path: Path, timeout: float = 1500) -> Outcome:
    """Every step of a page, in a new folder outside the repository, on a fresh home."""
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir(parents=True)
    home.mkdir(parents=True)
    assert ROOT not in work.parents
    steps, _ = extract(markdown, page)
    outcome = run_steps(steps, work, user_env(home, work / ".carbonflow"), timeout)
    if outcome.failed:  # the home's own logs say why (pytest removes the folder after a few sessions)
        logs = sorted((work / ".carbonflow").glob("*.log"))
        tails = [f"\n--- {log.name} (last lines):\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:])
                 for log in logs]  # fmt: skip
        outcome = Outcome(outcome.failed, outcome.ran, outcome.output + "".join(tails))
    return outcome


def _assert_ran(outcome: Outcome, steps: list[Step]) -> None:
    commands = [s for s in steps if not s.path]
    assert not outcome.failed, f"{outcome.failed}\n--- output (last 12000 characters):\n{outcome.output[-12000:]}"
    assert outcome.ran == len(commands), (outcome.ran, len(commands), outcome.output[-3000:])


# --- the pages ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES)
def test_each_page_shows_commands_and_marks_only_what_cannot_run_here_with_a_reason(page: str) -> None:
    steps, skipped = extract((DOCS / page).read_text(encoding="utf-8"), page)
    assert [s for s in steps if not s.path], f"{page} shows no command a user can run"
    for block in skipped:
        assert re.search(
            r"server|until (it is )?stopped|long-running|runs until|running stack|network|PyPI|install", block.reason
        ), (
            f"{block.where}: skipped for {block.reason!r}; only a command that runs until stopped (or one that needs "
            "it running), or an install from the network, may be left out"
        )


@pytest.mark.slow
def test_getting_started_commands_run_on_a_fresh_home(tmp_path: Path) -> None:
    page = "getting-started.md"
    markdown = (DOCS / page).read_text(encoding="utf-8")
    outcome = run_page(markdown, page, tmp_path, timeout=3600)  # two demo nights: 2 min idle, 20+ on a busy host
    _assert_ran(outcome, extract(markdown, page)[0])


@pytest.mark.slow
def test_own_job_commands_run_on_a_fresh_home(tmp_path: Path) -> None:
    page = "own-job.md"
    markdown = (DOCS / page).read_text(encoding="utf-8")
    steps = extract(markdown, page)[0]
    assert any(s.path.endswith("my_dag.py") for s in steps), "the page's DAG file is created from the page"
    outcome = run_page(markdown, page, tmp_path)
    _assert_ran(outcome, steps)


# --- the extractor and the runner can fail ------------------------------------------------------------------------

SAMPLE = """# A page

```python
# project/job.yaml
name: x
```

```bash
carbonflow --version     # prints the version
cat > notes.txt <<'EOF'
line one
EOF
echo a \\
  b
carbonflow --versoin     # exits 2: no such option
```

<!-- docs-test: skip (a server that runs until stopped) -->
```bash
carbonflow serve --dags .
```

```console
$ cat notes.txt
line one
$ test -f project/job.yaml
```

```python
print("not a file, not a command")
```
"""


def test_the_extractor_reads_commands_heredocs_files_expected_status_and_skips() -> None:
    steps, skipped = extract(SAMPLE, "sample.md")
    assert [(s.path, s.content) for s in steps if s.path] == [("project/job.yaml", "# project/job.yaml\nname: x\n")]
    assert [(s.command, s.expected_rc) for s in steps if not s.path] == [
        ("carbonflow --version     # prints the version", 0),
        ("cat > notes.txt <<'EOF'\nline one\nEOF", 0),
        ("echo a \\\n  b", 0),
        ("carbonflow --versoin     # exits 2: no such option", 2),
        ("cat notes.txt", 0),
        ("test -f project/job.yaml", 0),
    ]
    assert [(s.where, s.reason) for s in skipped] == [("sample.md:19", "a server that runs until stopped")]


def test_a_mark_without_a_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="docs-test: skip"):
        extract("<!-- docs-test: skip -->\n```bash\ntrue\n```\n", "bad.md")


def test_the_runner_passes_a_page_that_works_and_fails_on_a_broken_command(tmp_path: Path) -> None:
    good = run_page(SAMPLE, "sample.md", tmp_path / "good")
    _assert_ran(good, extract(SAMPLE, "sample.md")[0])
    assert "carbonflow 0." in good.output and "a b" in good.output

    broken = SAMPLE.replace("carbonflow --version     # prints", "carbonflow --versoin     # prints")
    outcome = run_page(broken, "sample.md", tmp_path / "broken")
    assert outcome.failed == "sample.md:9: `carbonflow --versoin     # prints the version` exited 2, expected 0"
    assert outcome.ran == 1  # it stopped there: later steps depend on earlier ones

    no_file = SAMPLE.replace("# project/job.yaml", "# other/job.yaml")
    assert run_page(no_file, "sample.md", tmp_path / "no-file").failed.startswith("sample.md:26: `test -f project")


def test_the_commands_run_outside_the_repository_on_a_fresh_home_with_the_venv_first(tmp_path: Path) -> None:
    page = (
        '```bash\npwd\necho "$CARBONFLOW_HOME $HOME"\ncommand -v carbonflow\n'
        "env | grep -c '^AIRFLOW'  # exits 1: none of the session's settings\n```\n"
    )
    outcome = run_page(page, "env.md", tmp_path)
    assert not outcome.failed, outcome.output
    assert f"\n{tmp_path / 'work'}\n" in outcome.output
    assert f"{tmp_path / 'work' / '.carbonflow'} {tmp_path / 'home'}" in outcome.output
    assert f"\n{VENV_BIN / 'carbonflow'}\n" in outcome.output


def test_a_broken_command_in_the_real_page_fails_it_naming_the_page_line_and_status(tmp_path: Path) -> None:
    """Own-job's page with its ``dags test`` command mistyped: the page's run stops there, named by line."""
    page = "own-job.md"
    markdown = (DOCS / page).read_text(encoding="utf-8")
    assert "\ncarbonflow dags test my_dag.py\n" in markdown
    broken = markdown.replace("\ncarbonflow dags test my_dag.py\n", "\ncarbonflow dags test my_dag.pyx\n")
    outcome = run_page(broken, page, tmp_path, timeout=600)
    assert re.fullmatch(r"own-job\.md:\d+: `carbonflow dags test my_dag\.pyx` exited 2, expected 0", outcome.failed)
    assert "is not a DAG file" in " ".join(outcome.output.split())
    assert (tmp_path / "work" / "my_dag.py").read_text(encoding="utf-8").startswith("# my_dag.py\n")
