"""DAG-file parse time and top-level hygiene: every file in dags/ parses in < 0.5 s, with no network and no
heavy import (torch, mlflow, pandas, ...) at DAG-file top level.

Each measurement runs in a fresh Python process that imports Airflow (as Airflow's dag-processor has when
it parses a file), then parses one file with Airflow's own ``DagBag``, under ``python -X importtime``.
The parse time counted against the limit is the ``DagBag`` time *plus* carbonflow's own import time taken
from the import tree (Airflow's provider discovery may import carbonflow during warm-up; a dag-processor
that had not would pay it in the parse). A heavy module counts when the import tree shows it imported by the
DAG file or by a carbonflow module. Sockets are patched from the first line of that process, so any
connection or DNS lookup is recorded (with the phase it happened in) and refused.

    python benchmarks/dag_parse.py            # 5 runs per file
    python benchmarks/dag_parse.py --quick    # 2 runs per file

The registry-generated nightly DAG (``dags/nightly_registry.py``) is measured twice: with the shipped
registry and with ``--registry-jobs`` (default 100) spec files, the shipped catalog's jobs under new names.

Writes benchmarks/results/dag_parse.json; exits 1 when a file is too slow, imports a heavy module or
touches the network.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DAGS = REPO / "dags"
RESULTS = REPO / "benchmarks" / "results"
LIMIT_S = 0.5
HEAVY = (
    "torch",
    "mlflow",
    "pandas",
    "sklearn",
    "scipy",
    "matplotlib",
    "codecarbon",
    "pynvml",
    "kubernetes",
    "requests_cache",
    "zeus",
)
MARKER = "CARBONFLOW_PARSE_START"

# Runs in the child process: warm Airflow, patch sockets, parse one file, report JSON on stdout.
CHILD = r"""
import json, socket, sys, time

calls = []
phase = ["warm-up"]
def _refuse(kind):
    def f(*args, **kwargs):
        calls.append({"phase": phase[0], "call": kind, "args": repr(args[1:2] if kind == "connect" else args[:1])})
        raise OSError(f"carbonflow dag_parse benchmark: network ({kind}) refused")
    return f
socket.socket.connect = _refuse("connect")
socket.socket.connect_ex = _refuse("connect")
socket.getaddrinfo = _refuse("getaddrinfo")
socket.create_connection = _refuse("create_connection")

import airflow.sdk  # noqa: F401  (warm, as the dag-processor is)
from airflow.dag_processing.dagbag import DagBag

before = set(sys.modules)
phase[0] = "parse"
sys.stderr.write("MARKER\n"); sys.stderr.flush()
t0 = time.perf_counter()
bag = DagBag(dag_folder=sys.argv[1], safe_mode=False)
elapsed = time.perf_counter() - t0
new = sorted(set(sys.modules) - before)
print(json.dumps({"parse_s": elapsed, "dag_ids": sorted(bag.dag_ids), "import_errors": {k: str(v)[-800:]
      for k, v in bag.import_errors.items()}, "network_calls": calls, "new_modules": new,
      "all_modules": sorted(sys.modules)}))
""".replace("MARKER", MARKER)


def importtime_tree(stderr: str) -> list[dict]:
    """Every ``-X importtime`` line as {module, cumulative_s, ancestors, after_marker} (parents from indentation)."""
    entries = []
    after = False
    for line in stderr.splitlines():
        if line.strip() == MARKER:
            after = True
            continue
        if not line.startswith("import time:"):
            continue
        parts = line[len("import time:") :].split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name_part = parts[2]
        depth = (len(name_part) - len(name_part.lstrip(" ")) - 1) // 2
        entries.append(
            {
                "module": name_part.strip(),
                "self_s": int(parts[0]) / 1e6,
                "cumulative_s": int(parts[1]) / 1e6,
                "depth": depth,
                "after_marker": after,
            }
        )
    stack: list[dict] = []  # children are printed before their parent: walk backwards
    for entry in reversed(entries):
        while stack and stack[-1]["depth"] >= entry["depth"]:
            stack.pop()
        entry["ancestors"] = [e["module"] for e in reversed(stack)]
        stack.append(entry)
    return entries


def _owner(ancestors: list[str]) -> str | None:
    """'carbonflow' or 'airflow': whichever of the two is the nearest ancestor (ancestors: nearest first)."""
    for a in ancestors:
        if a.startswith("carbonflow") or a.startswith("unusual_prefix_"):
            return "carbonflow"
        if a.startswith("airflow"):
            return "airflow"
    return None


def _is_ours(module: str) -> bool:
    return module.startswith("carbonflow") or module.startswith("unusual_prefix_")


def measure(path: Path, runs: int, env: dict[str, str]) -> dict:
    times: list[float] = []
    last: dict = {}
    carbonflow_import_s: list[float] = []
    tree: list[dict] = []
    for _ in range(runs):
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", CHILD, str(path)],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=REPO,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"parsing {path.name} crashed:\n{proc.stderr[-2000:]}")
        last = json.loads(proc.stdout.strip().splitlines()[-1])
        times.append(last["parse_s"])
        tree = importtime_tree(proc.stderr)
        # carbonflow's own import cost, wherever Airflow happened to trigger it (the provider entry point may
        # import carbonflow during Airflow's warm-up): self time of carbonflow modules and of the non-Airflow
        # modules they pulled in. Airflow's own modules (BaseOperator, ...) are the dag-processor's base cost.
        carbonflow_import_s.append(
            sum(
                e["self_s"]
                for e in tree
                if e["module"].startswith("carbonflow")
                or (not e["module"].startswith("airflow") and _owner(e["ancestors"]) == "carbonflow")
            )
        )
    # Heavy modules imported because of the DAG file or carbonflow's modules (anywhere in the process).
    heavy_paths = {}
    for e in tree:
        top = e["module"].split(".")[0]
        if top in HEAVY and (e["after_marker"] or _owner(e["ancestors"]) == "carbonflow"):
            chain = [a for a in e["ancestors"] if _is_ours(a)]
            heavy_paths.setdefault(top, " <- ".join([e["module"], *chain[:3]]))
    heavy_new = {m.split(".")[0] for m in last["new_modules"] if m.split(".")[0] in HEAVY}
    for top in heavy_new:
        heavy_paths.setdefault(top, "imported during the parse")
    heavy = sorted(heavy_paths)
    parse_plus_import = [p + c for p, c in zip(times, carbonflow_import_s, strict=True)]
    slowest = sorted(
        (e for e in tree if e["after_marker"] or e["module"].startswith("carbonflow")), key=lambda e: -e["cumulative_s"]
    )
    return {
        "file": str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name,
        "dag_ids": last["dag_ids"],
        "runs": runs,
        "parse_s_median": statistics.median(parse_plus_import),
        "parse_s_max": max(parse_plus_import),
        "dagbag_parse_s_median": statistics.median(times),
        "carbonflow_import_s_median": statistics.median(carbonflow_import_s),
        "parse_s_all": parse_plus_import,
        "import_errors": last["import_errors"],
        "network_calls": last["network_calls"],
        "heavy_imports": heavy,
        "heavy_import_paths": heavy_paths,
        "slowest_imports": [{"module": e["module"], "cumulative_s": round(e["cumulative_s"], 4)} for e in slowest[:8]],
        "new_module_count": len(last["new_modules"]),
    }


def write_registry(folder: Path, count: int) -> Path:
    """``count`` JobSpec files: the shipped catalog's jobs (carbonflow.workloads.catalog), renamed job-000…"""
    from carbonflow.workloads.catalog import NIGHTLY_JOBS

    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        job = {**NIGHTLY_JOBS[i % len(NIGHTLY_JOBS)], "name": f"job-{i:03d}"}
        (folder / f"job-{i:03d}.json").write_text(json.dumps(job))
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 runs per file instead of 5")
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--dags", type=Path, default=DAGS, help="folder of DAG files (default: the repo's dags/)")
    parser.add_argument("--out", type=Path, default=RESULTS / "dag_parse.json")
    parser.add_argument("--registry-jobs", type=int, default=100, help="jobs in the large registry (0: skip)")
    args = parser.parse_args(argv)
    runs = args.runs or (2 if args.quick else 5)
    if runs < 1:
        parser.error(f"--runs={runs} is not allowed; it must be >= 1")
    dags = args.dags.resolve()
    files = sorted(p for p in dags.glob("*.py") if not p.name.startswith("_"))
    if not files:
        print(f"no DAG files in {dags}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="carbonflow-dagparse-") as home:
        env = {
            **os.environ,
            "AIRFLOW_HOME": home,
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "CARBONFLOW_HOME": str(Path(home) / "cf"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        started = time.perf_counter()
        rows = [measure(path, runs, env) for path in files]
        registry_dag = dags / "nightly_registry.py"
        if args.registry_jobs > 0 and registry_dag.exists():
            jobs_dir = write_registry(Path(home) / "jobs", args.registry_jobs)
            row = measure(registry_dag, runs, {**env, "CARBONFLOW_JOBS_DIR": str(jobs_dir)})
            row["file"] += f" [{args.registry_jobs} registry jobs]"
            row["registry_jobs"] = args.registry_jobs
            rows.append(row)
        wall_s = time.perf_counter() - started
    max_parse_s = max(r["parse_s_median"] for r in rows)
    failures = []
    for r in rows:
        if r["parse_s_median"] >= LIMIT_S:
            failures.append(f"{r['file']}: median parse {r['parse_s_median']:.3f} s >= {LIMIT_S} s")
        if r["heavy_imports"]:
            failures.append(f"{r['file']}: heavy import at top level: {', '.join(r['heavy_imports'])}")
        if r["network_calls"]:
            failures.append(f"{r['file']}: network at top level: {r['network_calls']}")
        if r["import_errors"]:
            failures.append(f"{r['file']}: import errors: {r['import_errors']}")
    print(
        f"{'DAG file':<46} {'DAGs':>4} {'parse s':>8} {'= DagBag':>9} {'+ import':>9} {'max s':>7} "
        f"{'heavy imports':<16} network"
    )
    for r in rows:
        print(
            f"{r['file']:<46} {len(r['dag_ids']):>4} {r['parse_s_median']:>8.3f} {r['dagbag_parse_s_median']:>9.3f} "
            f"{r['carbonflow_import_s_median']:>9.3f} {r['parse_s_max']:>7.3f} "
            f"{(', '.join(r['heavy_imports']) or 'none'):<16} {len(r['network_calls'])}"
        )
        for top, path in r["heavy_import_paths"].items():
            print(f"    heavy: {top}: {path}")
        for imp in r["slowest_imports"][:3]:
            print(
                f"    import (cumulative, incl. Airflow modules it triggered): {imp['module']:<34} "
                f"{imp['cumulative_s']:.3f} s"
            )
    print(f"max_parse_s = {max_parse_s:.3f} (limit {LIMIT_S} s, median of {runs} fresh processes per file)")
    result = {
        "benchmark": "dag_parse",
        "limit_s": LIMIT_S,
        "max_parse_s": max_parse_s,
        "runs_per_file": runs,
        "heavy_modules_checked": list(HEAVY),
        "method": "fresh process per run; Airflow imported first; parse_s = DagBag(file) time + carbonflow's "
        "import time from python -X importtime; heavy imports attributed via the import tree; sockets patched",
        "python": sys.version.split()[0],
        "wall_s": wall_s,
        "files": rows,
        "passed": not failures,
        "failures": failures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    for f in failures:
        print(f"FAIL {f}", file=sys.stderr)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
