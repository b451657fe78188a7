"""Mutation testing of the core modules (issue 42): mutmut 3, each target in its own copy of the tree.

    .venv/bin/python tools/mutate.py                 # the core targets changed since the base (below)
    .venv/bin/python tools/mutate.py --all           # every core target
    .venv/bin/python tools/mutate.py limits-window admission   # these targets
    .venv/bin/python tools/mutate.py --list          # the targets, their files and tests, and which changed

`make mutate` runs the first (`make mutate ARGS=--all`, or `make mutate-all`, the second). Not in CI: slow.

Base of "changed": `git merge-base HEAD origin/main` when that remote branch exists, else the last commit
that touched docs/TESTING.md (where the scores were last recorded), else everything. A target changed when
one of its source files differs from the base in the work tree (committed or not, or is new).

Each target is mutated in a COPY of the work tree (`--workdir`, default /tmp/gateway-mutate/<target>): mutmut
writes its mutants under that copy's `mutants/`, never into this checkout, and the tests import the mutated
package from there. Per target, only its tests run (a fast subset: its unit tests and the few integration
tests that cover it); mutmut's own stats then run, for each mutant, only those tests that reach its function.

A mutant that survives is either killed by a new test or listed as equivalent in tools/mutants-equivalent.txt
(`<mutant name> | why no test can tell it apart`): those leave the denominator. The score of a target is
killed / (mutants - equivalent), timeouts counting as killed; "no tests" (no selected test reaches the
function) counts as survived. The last line printed is the one docs/TESTING.md records:
`mutation score: K/N killed (P %)`.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT_FILE = ROOT / "tools" / "mutants-equivalent.txt"
DOC = "docs/TESTING.md"
# never copied into a work dir (models/ is linked: the classifier's weights, read only)
SKIP_TOP = {".git", ".venv", "mutants", ".mypy_cache", ".pytest_cache", ".gateway", "models"}
LINKED_TOP = ("models",)


@dataclass(frozen=True)
class Target:
    name: str
    files: tuple[str, ...]  # source files to mutate; "a|b": a, or b where a has moved (the first that exists)
    tests: tuple[str, ...]  # pytest arguments: the fast subset that covers them
    only: tuple[str, ...] = ()  # mutant-name patterns (a part of a big file): empty = every function
    note: str = ""

    def resolve(self, tree: Path) -> list[str] | None:
        """The files in `tree` (each entry's first alternative that exists), or None when one is missing."""
        found = [next((alt for alt in entry.split("|") if (tree / alt).exists()), None) for entry in self.files]
        return None if None in found else [f for f in found if f is not None]

    def present(self, tree: Path = ROOT) -> bool:
        return self.resolve(tree) is not None

    def touched(self, changed: set[str] | None) -> bool:
        return changed is None or any(alt in changed for entry in self.files for alt in entry.split("|"))


U, I = "tests/unit/", "tests/integration/"

# smallest and most stable first; the cache keys last (rewritten around the request reading, issue 42)
TARGETS: tuple[Target, ...] = (
    Target("limits-window", ("gateway/limits/window.py", "gateway/limits/local.py"),
           (U + "test_limits.py", U + "test_mutants_limits.py")),
    Target("admission", ("gateway/admission/gradient.py", "gateway/admission/queue.py", "gateway/admission/gate.py"),
           (U + "test_admission.py", U + "test_stage_admission.py", U + "test_mutants_admission.py")),
    Target("pricing", ("gateway/config/routes.py",),
           (U + "test_account_settle.py", U + "test_config.py", U + "test_mutants_pricing.py"),
           only=("gateway.config.routes.xǁPricesǁ*", "gateway.config.routes.xǁTierǁprice_at__mutmut_*",
                 "gateway.config.routes.xǁTierǁ_dated_in_order__mutmut_*"),
           note="Prices.cost_usd and its validator, Tier.price_at and _dated_in_order only"),
    Target("limits", ("gateway/limits/limiter.py", "gateway/limits/replicas.py"),
           (U + "test_limits.py", U + "test_stage_policy.py", U + "test_mutants_limits.py",
            I + "test_limits_shared.py"),
           note="test_limits_burst.py left out: its exact count of a 60-request burst fails now and then under "
                "mutmut's tracing on a loaded machine, and mutmut needs every selected test green"),
    Target("accounting-records", ("gateway/accounting/records.py",),
           (U + "test_costs_reader.py", U + "test_account_settle.py", U + "test_costs_report.py",
            U + "test_mutants_records.py")),
    Target("account-stage", ("gateway/stages/account.py",),
           (U + "test_account_settle.py", U + "test_experiments_wiring.py", U + "test_mutants_account.py",
            U + "test_mutants_account_line.py")),
    Target("sessions", ("gateway/routing/sessions.py|gateway/sessions.py",
                        "gateway/routing/session.py|gateway/stages/session.py"),
           (U + "test_sessions.py", U + "test_mutants_sessions.py", I + "test_sessions.py")),
    Target("resume", ("gateway/upstream/continuation.py", "gateway/upstream/resume.py"),
           (U + "test_resume_pieces.py", U + "test_mutants_resume.py", U + "test_mutants_resume_parts.py",
            I + "test_resume.py")),
    Target("output-caps", ("gateway/sse.py",),
           (U + "test_sse.py", U + "test_sse_fuzz.py", U + "test_mutants_sse.py", I + "test_output_cap.py",
            I + "test_output_cap_choices.py")),
    Target("request-log-status", ("gateway/http.py",),
           (U + "test_mutants_http.py", U + "test_mutants_http_stream.py", I + "test_http_errors.py", I + "test_client_limits.py",
            I + "test_stream_endings.py", I + "test_edge_status.py"),
           only=("gateway.http.x_serve__mutmut_*", "gateway.http.x__stream__mutmut_*",
                 "gateway.http.x__write_behind__mutmut_*", "gateway.http.x__error__mutmut_*"),
           note="serve, _stream, _write_behind, _error: the status each request is logged with"),
    Target("reading", ("gateway/reading.py",),
           (U + "test_reading.py", U + "test_reading_property.py", U + "test_stage_cache.py", U + "test_parse.py",
            U + "test_mutants_reading.py"),
           note="the request reading (issue 42): mutated once the module exists"),
    Target("cache-keys", ("gateway/cache/keys.py",),
           (U + "test_reading.py", U + "test_stage_cache.py", U + "test_mutants_cache_keys.py")),
)

# mutmut's exit codes (mutmut.stats.status_by_exit_code), folded into what the score counts
KILLED = {"killed", "timeout", "segfault", "caught by type check"}
SURVIVED = {"survived", "no tests", "suspicious"}


@dataclass
class Outcome:
    target: str
    statuses: dict[str, str] = field(default_factory=dict)  # mutant name -> mutmut status
    equivalent: set[str] = field(default_factory=set)
    stale_equivalent: set[str] = field(default_factory=set)
    error: str | None = None
    seconds: float = 0.0
    deselected: list[str] = field(default_factory=list)  # selected tests failing on the unmutated tree
    diffs: dict[str, str] = field(default_factory=dict)  # survivor -> its changed lines

    def count(self, kinds: set[str]) -> int:
        return sum(1 for name, s in self.statuses.items() if s in kinds and name not in self.equivalent)

    @property
    def killed(self) -> int:
        return self.count(KILLED)

    @property
    def survivors(self) -> list[str]:
        return sorted(n for n, s in self.statuses.items() if s in SURVIVED and n not in self.equivalent)

    @property
    def unchecked(self) -> int:
        return sum(1 for s in self.statuses.values() if s not in KILLED | SURVIVED)

    @property
    def total(self) -> int:  # judged mutants, equivalents excluded
        return self.count(KILLED | SURVIVED)


def git(*args: str) -> str | None:
    done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def base_commit() -> tuple[str | None, str]:
    if git("rev-parse", "--verify", "--quiet", "origin/main") is not None:
        base = git("merge-base", "HEAD", "origin/main")
        if base:
            return base, "git merge-base HEAD origin/main"
    last = git("log", "-1", "--format=%H", "--", DOC)
    if last:
        return last, f"the last commit touching {DOC}"
    return None, "no base found: every target"


def changed_files(base: str) -> set[str]:
    names = set((git("diff", "--name-only", base) or "").splitlines())  # committed since base + work tree
    names |= set((git("ls-files", "--others", "--exclude-standard") or "").splitlines())
    return names


def load_equivalent() -> dict[str, str]:
    known: dict[str, str] = {}
    if EQUIVALENT_FILE.exists():
        for line in EQUIVALENT_FILE.read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                name, _, why = line.partition("|")
                known[name.strip()] = why.strip()
    return known


def copy_tree(dest: Path, commit: str | None) -> None:
    """This checkout's files (tracked and untracked, not ignored: uncommitted work included) into `dest`;
    with `commit`, that commit's tree instead (what others are editing in the work tree left out)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if commit is not None:
        archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest), "--exclude=models", "--exclude=models/*"], input=archive,
                       check=True)
        for top in LINKED_TOP:
            if (ROOT / top).exists():
                (dest / top).symlink_to(ROOT / top)
        return
    listing = git("ls-files", "-z", "--cached", "--others", "--exclude-standard") or ""
    for name in listing.split("\0"):
        if not name or name.split("/", 1)[0] in SKIP_TOP or not (ROOT / name).is_file():
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    for top in LINKED_TOP:
        if (ROOT / top).exists():
            (dest / top).symlink_to(ROOT / top)


def toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def failing_tests(dest: Path, tests: list[str], env: dict[str, str], timeout_s: float) -> list[str] | None:
    """The selected tests that fail on the unmutated copy (mutmut needs them all green): node ids, or None
    when pytest itself could not run them."""
    try:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *tests],
                              cwd=dest, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    failed = [ln.split()[1] for ln in done.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    return failed if done.returncode in (0, 1) else None


def configure(dest: Path, target: Target, files: list[str], deselect: list[str]) -> list[str]:
    """Append [tool.mutmut] to the copy's pyproject.toml; returns the test arguments that exist."""
    tests = [t for t in target.tests if (dest / t.split("::")[0]).exists()]
    tops = sorted({p.name for p in dest.iterdir()} - {"gateway", "mutants", "pyproject.toml", *LINKED_TOP})
    selection = tests + [arg for node in deselect for arg in ("--deselect", node)]
    pyproject = dest / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(text[:text.index("\n[tool.mutmut]")] if "\n[tool.mutmut]" in text else text)
    section = f"""
[tool.mutmut]
source_paths = ["gateway"]
only_mutate = {toml_list(files)}
also_copy = {toml_list(tops)}
pytest_add_cli_args_test_selection = {toml_list(selection)}
pytest_add_cli_args = ["-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"]
use_git_change_detection = false
timeout_multiplier = 10.0
"""
    with (dest / "pyproject.toml").open("a") as f:
        f.write(section)
    if (dest / "mutants").exists():
        shutil.rmtree(dest / "mutants")
    (dest / "mutants").mkdir()
    for top in LINKED_TOP:  # mutmut copies also_copy into mutants/; the big read-only folders are linked
        if (ROOT / top).exists():
            (dest / "mutants" / top).symlink_to(ROOT / top)
    return tests


def read_statuses(dest: Path, target: Target, files: list[str]) -> dict[str, str]:
    from mutmut.stats import status_by_exit_code  # the venv's mutmut: its own exit-code table

    statuses: dict[str, str] = {}
    for source in files:
        meta = dest / "mutants" / (source + ".meta")
        if not meta.exists():
            continue
        data = json.loads(meta.read_text())
        for name, code in data.get("exit_code_by_key", {}).items():
            if target.only and not any(fnmatch.fnmatchcase(name, p) for p in target.only):
                continue
            statuses[name] = status_by_exit_code[code]
    return statuses


DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import get_diff_for_mutant
for name in json.loads(sys.stdin.read()):
    try:
        diff = get_diff_for_mutant(name)
    except Exception as exc:  # a mutant mutmut cannot show: say so, keep the others
        diff = repr(exc)
    print(json.dumps([name, diff]))
"""


def mutant_diffs(dest: Path, names: list[str]) -> dict[str, str]:
    """The changed lines of each mutant (what `mutmut show NAME` prints), in one process for all."""
    if not names:
        return {}
    done = subprocess.run([sys.executable, "-c", DIFFS], cwd=dest, input=json.dumps(names), capture_output=True,
                          text=True)
    diffs: dict[str, str] = {}
    for line in done.stdout.splitlines():
        if line.startswith("["):
            name, diff = json.loads(line)
            kept = [ln for ln in diff.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
            diffs[name] = "\n".join(kept) or diff.strip()
    return diffs


def mutmut_bin() -> Path:
    return Path(sys.executable).parent / "mutmut"


STATS_FAILED = (b"failed to collect stats", b"Failed to run clean test")  # mutmut: a selected test fails as is


def run_target(target: Target, workdir: Path, jobs: int, timeout_s: float, equivalent: dict[str, str],
               quiet: bool, commit: str | None, again: bool = False) -> Outcome:
    outcome = Outcome(target.name)
    dest = workdir / target.name
    started = time.monotonic()
    if again:  # --report: what the last run left in the work dir
        files = target.resolve(dest) if dest.exists() else None
        if files is None:
            outcome.error = f"no earlier run in {dest}"
            return outcome
        return judged(outcome, dest, target, files, equivalent, quiet)
    copy_tree(dest, commit)
    files = target.resolve(dest)
    if files is None:
        outcome.error = "its source is missing in this tree"
        return outcome
    tests = configure(dest, target, files, [])
    if not tests:
        outcome.error = "none of its tests exist"
        return outcome
    args = [str(mutmut_bin()), "run", "--max-children", str(jobs), *target.only]
    log_path = dest / "mutmut.log"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MUTANT_UNDER_TEST")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    print(f"[{target.name}] mutmut in {dest} (log {log_path}); tests: {' '.join(tests)}", flush=True)
    code = run_mutmut(args, dest, env, log_path, timeout_s, outcome)
    if code not in (0, None) and any(m in log_path.read_bytes()[-5000:] for m in STATS_FAILED):
        # a selected test fails on the unmutated tree (work in progress, or a flaky one): leave it out, say so
        failed = failing_tests(dest, tests, env, timeout_s)
        if failed:
            outcome.deselected = failed
            print(f"[{target.name}] failing without any mutant, left out: {' '.join(failed)}", flush=True)
            configure(dest, target, files, failed)
            code = run_mutmut(args, dest, env, log_path, timeout_s, outcome)
    outcome.seconds = time.monotonic() - started
    if code not in (0, None):
        tail = log_path.read_bytes()[-3000:].decode(errors="replace").replace("\r", "\n")
        outcome.error = f"mutmut exited {code}:\n{tail}"
    return judged(outcome, dest, target, files, equivalent, quiet)


def judged(outcome: Outcome, dest: Path, target: Target, files: list[str], equivalent: dict[str, str],
           quiet: bool) -> Outcome:
    outcome.statuses = read_statuses(dest, target, files)
    names = set(outcome.statuses)
    outcome.equivalent = {n for n in names if n in equivalent and outcome.statuses[n] in SURVIVED}
    outcome.stale_equivalent = {n for n in names if n in equivalent and outcome.statuses[n] in KILLED}
    report(outcome, dest, equivalent, quiet)
    return outcome


def run_mutmut(args: list[str], dest: Path, env: dict[str, str], log_path: Path, timeout_s: float,
               outcome: Outcome) -> int | None:
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, cwd=dest, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = None
            outcome.error = f"stopped after {timeout_s:.0f} s: partial results"
    return code


def report(o: Outcome, dest: Path, equivalent: dict[str, str], quiet: bool) -> None:
    print(f"[{o.target}] {o.killed}/{o.total} killed, {len(o.equivalent)} equivalent, "
          f"{o.unchecked} not checked, {o.seconds:.0f} s", flush=True)
    if o.error:
        print(f"[{o.target}] {o.error}")
    if o.deselected:
        print(f"[{o.target}] left out, failing on the unmutated tree: {' '.join(o.deselected)}")
    for name in sorted(o.stale_equivalent):
        print(f"[{o.target}] listed as equivalent but now killed (remove it from {EQUIVALENT_FILE.name}): {name}")
    o.diffs = mutant_diffs(dest, o.survivors)
    if not quiet:
        for name in o.survivors:
            print(f"--- {o.statuses[name]}: {name}\n{o.diffs.get(name, '(no diff)')}")
        for name in sorted(o.equivalent):
            print(f"--- equivalent: {name}: {equivalent[name]}")


def markdown(outcomes: list[Outcome], equivalent: dict[str, str]) -> str:
    """The table, each target's survivors (name and changed lines) and its equivalents, for docs/TESTING.md."""
    lines = ["| target | killed | judged | equivalent | score |", "|---|---|---|---|---|"]
    for o in outcomes:
        pct = f"{100.0 * o.killed / o.total:.1f} %" if o.total else "-"
        lines.append(f"| {o.target} | {o.killed} | {o.total} | {len(o.equivalent)} | {pct} |")
    for o in outcomes:
        lines += ["", f"#### {o.target}: {len(o.survivors)} surviving", ""]
        for name in o.survivors:
            changed = " / ".join(ln.strip() for ln in o.diffs.get(name, "").splitlines())
            lines.append(f"- `{name}` ({o.statuses[name]}): `{changed}`")
        for name in sorted(o.equivalent):
            lines.append(f"- equivalent `{name}`: {equivalent[name]}")
    return "\n".join(lines) + "\n"


def score_line(killed: int, total: int) -> str:
    pct = 100.0 * killed / total if total else 0.0
    return f"mutation score: {killed}/{total} killed ({pct:.1f} %)"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("targets", nargs="*", help="target names (default: those changed since the base)")
    parser.add_argument("--all", action="store_true", help="every core target")
    parser.add_argument("--list", action="store_true", help="print the targets and exit")
    parser.add_argument("--base", help="a commit to compare with instead of the default base")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested at once (mutmut --max-children)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per target before partial results")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gateway-mutate"))
    parser.add_argument("--quiet", action="store_true", help="no diffs of the survivors")
    parser.add_argument("--json", type=Path, help="also write the per-target counts here")
    parser.add_argument("--report", action="store_true", help="run nothing: report what the last run left")
    parser.add_argument("--markdown", type=Path, help="also write the table and the survivors as Markdown here")
    parser.add_argument("--commit", help="mutate this commit's tree (e.g. HEAD) instead of the work tree")
    opts = parser.parse_args()

    by_name = {t.name: t for t in TARGETS}
    unknown = [n for n in opts.targets if n not in by_name]
    if unknown:
        parser.error(f"unknown targets {unknown}; known: {', '.join(by_name)}")
    base, why = (opts.base, f"--base {opts.base}") if opts.base else base_commit()
    changed = changed_files(base) if base else None
    if opts.all:
        chosen = list(TARGETS)
    elif opts.targets:
        chosen = [by_name[n] for n in opts.targets]
    else:
        chosen = [t for t in TARGETS if t.touched(changed)]
    if opts.list:
        print(f"base: {base or '-'} ({why})")
        for t in TARGETS:
            flag = "changed" if t.touched(changed) else "unchanged"
            state = flag if t.present() else "missing"
            print(f"{t.name:20} {state:9} {' '.join(t.files)}{'  (' + t.note + ')' if t.note else ''}\n"
                  f"{'':31}tests: {' '.join(t.tests)}")
        return 0
    missing = [] if opts.commit else [t.name for t in chosen if not t.present()]  # a commit's tree: checked there
    chosen = [t for t in chosen if t.name not in missing]
    if missing:
        print(f"skipped (its source does not exist yet): {', '.join(missing)}")
    if not opts.all and not opts.targets:
        print(f"changed since {base or '-'} ({why}): {', '.join(t.name for t in chosen) or 'none'}")
    if not chosen:
        return 0
    if not mutmut_bin().exists() and not opts.report:
        print(f"{mutmut_bin()} is missing: `make` installs it (the dev extra)", file=sys.stderr)
        return 2
    equivalent = load_equivalent()
    outcomes = [run_target(t, opts.workdir, opts.jobs, opts.timeout, equivalent, opts.quiet, opts.commit, opts.report) for t in chosen]

    print("\n| target | killed | judged | equivalent | not checked | score |\n|---|---|---|---|---|---|")
    for o in outcomes:
        pct = f"{100.0 * o.killed / o.total:.1f} %" if o.total else "-"
        print(f"| {o.target} | {o.killed} | {o.total} | {len(o.equivalent)} | {o.unchecked} | {pct} |")
    killed, total = sum(o.killed for o in outcomes), sum(o.total for o in outcomes)
    if opts.json:
        opts.json.write_text(json.dumps({o.target: {"killed": o.killed, "judged": o.total,
                                                    "equivalent": sorted(o.equivalent), "survivors": o.survivors,
                                                    "not_checked": o.unchecked, "error": o.error,
                                                    "deselected": o.deselected}
                                         for o in outcomes}, indent=1))
    if opts.markdown:
        opts.markdown.write_text(markdown(outcomes, equivalent))
    scope = "all core targets" if opts.all else ", ".join(o.target for o in outcomes)
    print(f"\n({scope}; tools/mutate.py {' '.join(sys.argv[1:])})")
    print(score_line(killed, total))
    return 1 if any(o.error for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
