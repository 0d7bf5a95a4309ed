"""The README's and the docs' code and commands keep working.

- every Python block that builds a spec, and every SQL view shown, builds;
- every `make <target>` shown is a Makefile target (and every `VAR=...` after it a Makefile variable);
- every `laminar [global options] <command> [--options]` shown names a real command and real options
  (checked against `laminar <command> --help`, once per command); likewise `dagster ...` commands and
  `python -m <module> [--options]`;
- every relative link resolves to a file (and a heading, for `#anchors` into Markdown);
- `dagster asset materialize` works from the repo root, and `dagster dev` serves the definitions.

Only the `dagster asset materialize` test starts Spark.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime, timedelta

import pytest

from laminar_assets.engine import FlowSpec, StageSpec
from tests.deploy.processes import free_port

REPO = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent
README = REPO / "README.md"
DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^[ \t]*```(\w*)[ \t]*\n(.*?)^[ \t]*```", re.M | re.S)
# `make X VAR='...'`: which file's argument parser the options in VAR belong to
ARGS_VARS = {"SOAK_ARGS": "tests/soak.py", "BENCH_ARGS": "bench/run.py"}


def fenced_blocks(path: pathlib.Path) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block of a Markdown file."""
    return [(m.group(1).lower(), m.group(2)) for m in FENCE.finditer(path.read_text())]


def prose(path: pathlib.Path) -> str:
    """A Markdown file's text outside fenced code blocks."""
    return FENCE.sub("", path.read_text())


def python_blocks(path: pathlib.Path = README) -> list[str]:
    return [body for lang, body in fenced_blocks(path) if lang == "python"]


def spec_blocks() -> list[tuple[pathlib.Path, str]]:
    return [(p, b) for p in DOCS for b in python_blocks(p) if "FlowSpec(" in b or "StageSpec(" in b]


def sql_blocks() -> list[tuple[pathlib.Path, str]]:
    return [(p, body) for p in DOCS for lang, body in fenced_blocks(p) if lang == "sql"]


def snippets() -> list[tuple[str, str]]:
    """(where, text) of every piece of shell a reader may copy: lines of shell code blocks (comments
    split off; code spans in comments count too) and every inline code span outside code blocks. A
    snippet is a command when it starts with one (see `commands`)."""
    out = []
    for path in DOCS:
        name = path.relative_to(REPO).as_posix()
        for lang, body in fenced_blocks(path):
            if lang not in SHELL_LANGS:
                continue
            for line in body.splitlines():
                code, _, comment = line.partition(" #")
                out.append((name, code.strip().removeprefix("$ ")))
                out += [(name, span) for span in re.findall(r"`([^`\n]+)`", comment)]
        out += [(name, span) for span in re.findall(r"`([^`\n]+)`", prose(path))]
    return out


def tokens(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:  # an unclosed quote: a command shown over several lines; keep what precedes it
        for quote in "\"'":
            if text.count(quote) % 2:
                text = text[:text.rindex(quote)]
        try:
            return shlex.split(text)
        except ValueError:
            return []


def options(words: list[str]) -> list[str]:
    """The `--options` among a command's words (`[--rows N]` -> `--rows`, `--x=1` -> `--x`)."""
    found = []
    for word in words:
        if word in ("|", "||", "&&", ";", "&", ">", "2>&1"):
            break
        word = word.lstrip("[(")
        if word.startswith("--") and len(word) > 2:
            found.append(re.split(r"[=\]\)|,]", word)[0])
    return found


def commands(program: str) -> list[tuple[str, str, list[str]]]:
    """(where, snippet, words after the program) for every snippet that calls `program` (after any
    `VAR=value` assignments: `TEST_WORKERS=0 make test`, `.venv/bin/laminar ...`)."""
    out = []
    for where, text in snippets():
        words = tokens(text)
        i = 0
        while i < len(words) and re.match(r"^[A-Z_][A-Z0-9_]*=", words[i]):
            i += 1
        if i < len(words) and (words[i] == program or words[i].endswith("/" + program)):
            out.append((where, text, words[i + 1:]))
    return out


@functools.cache
def help_text(*argv: str) -> str:
    proc = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    assert proc.returncode == 0, f"{' '.join(argv)} --help failed: {proc.stderr[-2000:]}"
    return proc.stdout


# --- the code shown ---------------------------------------------------------------------------------


def test_readme_flow_example_builds_a_valid_spec():
    [block] = [b for b in python_blocks(README) if "FlowSpec(" in b]
    namespace: dict = {}
    exec(compile(block, "README.md", "exec"), namespace)
    spec = namespace["notional_by_venue_15m"]
    assert isinstance(spec, FlowSpec) and spec.shape.size.total_seconds() == 900
    from laminar_assets.flows import load_specs

    stage = {s.name: s for s in load_specs()}["normalized_trades"]
    assert spec.sources == (stage.name,)  # the example reads the shared stage


def test_every_spec_shown_in_python_builds():
    blocks = spec_blocks()
    assert len(blocks) >= 2, "the README's and docs/python-flows.md's FlowSpec examples"
    for path, block in blocks:
        namespace: dict = {}
        exec(compile(block, str(path.relative_to(REPO)), "exec"), namespace)
        specs = [v for v in namespace.values() if isinstance(v, (FlowSpec, StageSpec))]
        assert specs, f"{path.name}: a block that mentions a spec builds none:\n{block}"


def test_every_sql_view_shown_compiles():
    from laminar_assets.engine import compile_sql_definitions

    blocks = sql_blocks()
    assert len(blocks) >= 4, "the README's view and docs/sql-flows.md's three"
    for path, block in blocks:
        specs, exports = compile_sql_definitions(block, origin="README")
        names = re.findall(r"CREATE MATERIALIZED VIEW\s+(\w+)", block, re.I)
        assert [s.name for s in specs] == names, (path.name, block)
        assert [e.name for e in exports] == re.findall(r"CREATE SINK\s+(\w+)", block, re.I), (path.name, block)
    # the stage example is a stage, the grouped views are flows
    kinds = {s.name: type(s) for _, b in blocks for s in compile_sql_definitions(b, origin="README")[0]}
    assert kinds["normalized_trades"] is StageSpec and kinds["vwap_1m"] is FlowSpec


def test_every_export_shown_in_python_builds():
    from laminar_assets.engine import ExportSpec

    blocks = [(p, b) for p in DOCS for b in python_blocks(p) if "Export(" in b]
    assert blocks, "docs/exports.md's PostgresExport example"
    for path, block in blocks:
        namespace: dict = {}
        exec(compile(block, str(path.relative_to(REPO)), "exec"), namespace)
        assert any(isinstance(v, ExportSpec) for v in namespace.values()), f"{path.name}: no export built:\n{block}"


def test_sql_error_shown_is_the_one_raised():
    from laminar_assets.engine import compile_sql
    from laminar_assets.errors import SqlDefinitionError

    bad = ("CREATE MATERIALIZED VIEW bad AS\n"
           "SELECT symbol, TUMBLE(event_time, INTERVAL '1' MINUTE),\n"
           "       px, SUM(price) AS s\n"
           "FROM normalized_trades GROUP BY symbol, TUMBLE(event_time, INTERVAL '1' MINUTE);")
    with pytest.raises(SqlDefinitionError) as err:
        compile_sql(bad, origin="flows/bad.sql")
    assert str(err.value) in (REPO / "docs" / "sql-flows.md").read_text()


def test_whole_pipeline_in_sql_compiles():
    from laminar_assets.engine.sql import compile_sql_file

    assert "sql/trades_pipeline.sql" in (REPO / "docs" / "sql-flows.md").read_text()
    assert compile_sql_file(REPO / "docs" / "sql" / "trades_pipeline.sql")


# --- the commands shown -----------------------------------------------------------------------------


def test_readme_commands_exist():
    makefile = (REPO / "Makefile").read_text()
    text = README.read_text()
    for target in ("make demo", "make test", "make ui", "make quality"):
        assert target in text, target
    everything = "\n".join(p.read_text() for p in DOCS)
    for target in ("make test-fast", "make soak", "make bench", "make bench-smoke"):
        assert target in everything, target
    for target in ("demo", "test", "ui", "test-fast", "quality", "soak"):
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), target
    assert "make test" in (REPO / ".ci" / "run").read_text()


def test_every_make_target_shown_exists():
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    seen, problems = set(), []
    for where, text, words in commands("make"):
        variables = []
        target = None
        for word in words:
            if re.match(r"^[A-Z_][A-Z0-9_]*=", word):
                variables.append(word)
            elif target is None and re.match(r"^[a-z][\w-]*$", word):
                target = word
            else:
                break
        if target is None:
            continue  # `make` named in prose, not a command
        seen.add(target)
        if target not in targets:
            problems.append(f"{where}: `{text}`: no target {target!r} in the Makefile")
        for assignment in variables:
            name, _, value = assignment.partition("=")
            if not re.search(rf"\b{name}\b", makefile):
                problems.append(f"{where}: `{text}`: the Makefile has no {name}")
            elif name in ARGS_VARS:
                source = (REPO / ARGS_VARS[name]).read_text()
                problems += [f"{where}: `{text}`: {ARGS_VARS[name]} takes no {option}"
                             for option in options(shlex.split(value)) if f'"{option}"' not in source]
    assert not problems, "\n".join(problems)
    assert {"demo", "test", "ui", "quality", "soak", "bench", "bench-smoke", "test-fast"} <= seen, seen


@pytest.mark.process
def test_every_laminar_command_shown_exists():
    """One `laminar <command> --help` per command shown; every option shown must be in its help."""
    laminar = str(BIN / "laminar")
    top = help_text(laminar)
    shown: dict[str, dict[str, str]] = {}  # command -> option -> where it is shown first
    problems = []
    for where, text, words in commands("laminar"):
        i = 0
        while i < len(words) and words[i].startswith("-"):  # global options come first
            if words[i] not in top:
                problems.append(f"{where}: `{text}`: laminar has no global option {words[i]}")
            i += 2 if words[i] == "--root" else 1
        if i >= len(words) or not re.match(r"^[a-z][a-z-]*$", words[i]):
            continue  # `laminar` alone, or `laminar <command>`
        opts = shown.setdefault(words[i], {"": f"{where}: `{text}`"})
        for option in options(words[i + 1:]):
            opts.setdefault(option, f"{where}: `{text}`")
    assert {"demo", "generate", "serve", "dag", "explain", "status", "refill", "check", "quarantine", "sql"} <= set(shown)
    for command, opts in sorted(shown.items()):
        proc = subprocess.run([laminar, command, "--help"], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
        if proc.returncode != 0:
            problems.append(f"{opts['']}: `laminar {command}` is not a command")
            continue
        problems += [f"{where}: `laminar {command}` has no option {option}" for option, where in opts.items()
                     if option and not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", proc.stdout)]
    assert not problems, "\n".join(problems)


@pytest.mark.process
def test_every_dagster_command_shown_exists():
    dagster = str(BIN / "dagster")
    seen, problems = set(), []
    for where, text, words in commands("dagster"):
        path = []
        for word in words:
            if re.match(r"^[a-z][a-z_]*$", word):
                path.append(word)
            else:
                break
        if not path:
            continue
        seen.add(" ".join(path))
        help_ = help_text(dagster, *path)
        problems += [f"{where}: `{text}`: `dagster {' '.join(path)}` has no option {option}"
                     for option in options(words[len(path):]) if option not in help_]
    assert not problems, "\n".join(problems)
    assert {"dev", "asset materialize"} <= seen, seen


def test_every_dg_command_shown_is_one_the_component_test_runs():
    """`dg` commands shown in the docs are run, with the options shown, by the team-project test
    (tests/orchestration/test_component.py): `dg --help` cannot check them (dg's help prints usage only)."""
    test = "\n".join((REPO / "tests" / "orchestration" / f).read_text() for f in ("test_component.py", "team_project.py"))
    ran = set(re.findall(r'"(scaffold|list|launch|dev)", "?([\w.-]*)', test))
    shown, problems = set(), []
    for where, text, words in commands("dg"):
        if not words:
            continue
        command = (words[0], words[1] if len(words) > 1 and words[0] in ("scaffold", "list") else "")
        shown.add(command)
        if words[0] in ("scaffold", "list") and (words[0], words[1]) not in ran or \
                words[0] in ("launch", "dev") and not any(c == words[0] for c, _ in ran):
            problems.append(f"{where}: `{text}`: not run by test_component.py")
        problems += [f"{where}: `{text}`: option {o} not used by test_component.py"
                     for o in options(words[1:]) if f'"{o}"' not in test]
    assert not problems, "\n".join(problems)
    assert {("scaffold", "defs"), ("list", "defs"), ("dev", "")} <= shown, shown


def test_every_python_module_shown_exists():
    seen, problems = set(), []
    for where, text, words in commands("python"):
        if words[:1] != ["-m"] or len(words) < 2:
            continue
        module = words[1]
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.origin:
            problems.append(f"{where}: `{text}`: no module {module}")
            continue
        seen.add(module)
        source = pathlib.Path(spec.origin).read_text()
        problems += [f"{where}: `{text}`: {module} takes no {option}"
                     for option in options(words[2:]) if f'"{option}"' not in source]
    assert not problems, "\n".join(problems)
    assert {"bench.daemon_freshness", "bench.commit_paths", "laminar_assets.deploy.class_archive_writer"} <= seen, seen


# --- links ------------------------------------------------------------------------------------------


def slugs(path: pathlib.Path) -> set[str]:
    """GitHub's anchors for a Markdown file's headings."""
    out, counts = set(), {}
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", prose(path), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = counts.get(slug, 0)
        counts[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_relative_link_resolves():
    checked, problems = 0, []
    for path in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", prose(path)):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(REPO)}: ({target})"
            checked += 1
            if not linked.exists():
                problems.append(f"{where}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in slugs(linked):
                problems.append(f"{where}: no heading #{anchor} in {linked.name}")
    assert not problems, "\n".join(problems)
    assert checked > 50


def test_docs_index_lists_every_page():
    index = (REPO / "docs" / "README.md").read_text()
    for page in (REPO / "docs").glob("*.md"):
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not link {page.name}"


# --- Dagster from the repo root ---------------------------------------------------------------------


@pytest.mark.spark
def test_dagster_asset_materialize_from_repo_root(tmp_path):
    from tests.conftest import Lake
    from tests.orchestration.pipeline import BASE, create_sources

    # the repository's flows start 'today - 2 days' (pyproject.toml): the rows land in the last hour
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    lake = Lake(str(tmp_path / "lake"))
    create_sources(lake, [(i, row_time.replace("2024-01-02 09", f"{hour:%Y-%m-%d %H}"), *rest)
                          for i, row_time, *rest in BASE])
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "LAMINAR_ROOT": lake.root}
    assert any("dagster asset materialize -m laminar_assets.definitions" in p.read_text() for p in DOCS)
    proc = subprocess.run([str(BIN / "dagster"), "asset", "materialize", "-m", "laminar_assets.definitions",
                           "--select", "normalized_trades",
                           "--partition", f"{hour:%Y-%m-%d-%H}:00"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(lake.read("normalized_trades")["trade_id"]) == [1, 2, 3]


@pytest.mark.process
def test_dagster_dev_serves_the_definitions(tmp_path):
    assert any("`dagster dev`" in p.read_text() for p in DOCS)
    port = free_port()
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    proc = subprocess.Popen([str(BIN / "dagster"), "dev", "-h", "127.0.0.1", "-p", str(port)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 120
        body = ""
        while time.time() < deadline:
            try:
                query = b'{"query": "{ assetNodes { assetKey { path } } }"}'
                req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=query,
                                             headers={"Content-Type": "application/json"})
                body = urllib.request.urlopen(req, timeout=5).read().decode()
                if "vwap_1m" in body:
                    break
            except OSError:
                pass
            time.sleep(2)
        assert "vwap_1m" in body and "normalized_trades" in body, body[:500]
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:  # e.g. SIGTERM ignored (an inherited ignored SIGINT): not left behind
            os.killpg(proc.pid, 9)
            proc.wait(30)
            raise
