"""The configuration tables in the docs, and the stand-in's key table, are generated from control/config.py."""
from __future__ import annotations

import importlib.util

from tests.conftest import REPO

spec = importlib.util.spec_from_file_location("update_config_docs", REPO / "ci/update-config-docs.py")
gen = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gen)


def test_config_tables_are_up_to_date():
    for f in gen.FILES:
        text = f.read_text()
        assert gen.render(text) == text, f"{f} is stale: run `python3 ci/update-config-docs.py`"


def test_standin_key_table_is_up_to_date():
    """The Go stand-in's keys, defaults and ranges are generated from control/config.py."""
    assert gen.GO_KEYS.read_text() == gen.go_keys(), f"{gen.GO_KEYS} is stale: run `python3 ci/update-config-docs.py`"
    for k in (k for k in gen.config.KEYS if k.standin):
        assert f'{{Name: "{k.name}", Env: "{k.env}",' in gen.GO_KEYS.read_text()


def test_thaw_config_markdown_prints_the_table():
    from click.testing import CliRunner

    from control import config
    from control.cli.main import main
    r = CliRunner().invoke(main, ["config", "--markdown"])
    assert r.exit_code == 0, r.output
    assert r.output == config.markdown_table()


def test_every_exit_status_is_documented_in_the_readme_and_the_help():
    from click.testing import CliRunner

    from control.cli.main import main
    from control.errors import EXIT_CODE, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_STATUSES
    documented = {code for code, _ in EXIT_STATUSES}
    assert {code for _, code in EXIT_CODE} | {0, EXIT_INTERNAL, EXIT_INTERRUPTED} <= documented
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Command line", 1)[1].split("\n## ", 1)[0]
    for code, _ in EXIT_STATUSES:
        assert f"\n| {code} |" in section, f"exit status {code} is not in README's command-line section"
    r = CliRunner().invoke(main, ["--help"])
    assert r.exit_code == 0
    for code, text in EXIT_STATUSES:
        assert f"{code:>3}  {text.split()[0]}" in r.output, code


# -- links and commands in README.md and docs/ (issue 31) -------------------------------

import re  # noqa: E402

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# Dated records show commands as they were run then (`thaw bench` was a command once):
# only the current docs must name commands that exist.
CURRENT = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose_and_code(path):
    """(prose lines, code lines) of a markdown file; inline code is cut out of the prose
    and added to the code."""
    prose, code, fenced = [], [], False
    for line in path.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            code.append(line)
            continue
        spans = re.findall(r"`([^`]+)`", line)
        code += spans
        prose.append(re.sub(r"`[^`]+`", "``", line))
    return prose, code


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: link text kept, lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text().splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)):
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def test_every_relative_link_in_the_readme_and_docs_resolves():
    broken = []
    for doc in DOCS:
        prose, _ = _prose_and_code(doc)
        for line in prose:
            for _, target in _LINK.findall(line):
                if re.match(r"^[a-z]+:", target):
                    continue   # http:, https:, mailto:
                path, _, anchor = target.partition("#")
                dest = (doc.parent / path).resolve() if path else doc
                where = f"{doc.relative_to(REPO)}: ({target})"
                if not dest.exists():
                    broken.append(f"{where}: no {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    broken.append(f"{where}: no heading with anchor #{anchor}")
    assert not broken, "\n".join(broken)


def test_the_link_checker_finds_a_broken_link_and_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n## Two words\n\nsee [b](b.md), [x](#two-words), [y](#nope)\n")
    assert anchors(tmp_path / "a.md") == {"top", "two-words"}
    prose, _ = _prose_and_code(tmp_path / "a.md")
    targets = [t for line in prose for _, t in _LINK.findall(line)]
    assert targets == ["b.md", "#two-words", "#nope"]
    assert slug("Streaming restore (issue 18)") == "streaming-restore-issue-18"
    assert slug("`thaw` under [Kubernetes](k.md)") == "thaw-under-kubernetes"


_GLOBAL_WITH_VALUE = {"--config", "--runsc", "--root"}
_STOP = {"--", "|", "||", ";", "&&", "&", "#", ">", "2>&1", "\\"}


def thaw_invocations(text: str) -> list[tuple[str, list[str]]]:
    """(command, its --options) of every `thaw COMMAND ...` in a line of code."""
    tokens = [t.strip("[](){}'\",") for t in text.replace("\\|", " ").split()]
    if tokens[:1] == ["helm"]:
        return []   # Helm's command line: `thaw` is the release's name there, deploy/helm/thaw the chart
    out = []
    for i, t in enumerate(tokens):
        if t != "thaw" and not t.endswith("/thaw"):
            continue
        j = i + 1
        while j < len(tokens) and tokens[j].startswith("-"):
            j += 2 if tokens[j] in _GLOBAL_WITH_VALUE else 1
        if j >= len(tokens) or not re.fullmatch(r"[a-z][a-z-]*(/[a-z][a-z-]*)*", tokens[j]):
            continue   # `thaw ...`, a function definition, a bare `thaw`
        opts = []
        for u in tokens[j + 1:]:
            if u in _STOP or u.startswith("#") or u == "thaw" or u.endswith("/thaw"):
                break
            if u.startswith("--") and len(u) > 2:
                opts.append(u.split("=", 1)[0])
        out += [(name, opts) for name in tokens[j].split("/")]
    return out


def test_every_thaw_command_the_docs_show_exists():
    from control.cli.main import main
    group_opts = {o for p in main.params for o in (*p.opts, *p.secondary_opts)}
    bad = []
    for doc in CURRENT:
        _, code = _prose_and_code(doc)
        for line in code:
            for name, opts in thaw_invocations(line):
                cmd = main.commands.get(name)
                if cmd is None:
                    bad.append(f"{doc.relative_to(REPO)}: `thaw {name}`: no such command ({line.strip()})")
                    continue
                known = group_opts | {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
                bad += [f"{doc.relative_to(REPO)}: `thaw {name} {o}`: no such option ({line.strip()})"
                        for o in opts if o not in known]
    assert not bad, "\n".join(bad)


def test_the_command_checker_reads_command_lines():
    assert thaw_invocations("sudo .venv/bin/thaw --json provision --dry-run --from build") == \
        [("provision", ["--dry-run", "--from"])]
    assert thaw_invocations("thaw run --id x --bind /a -- python3 --version") == [("run", ["--id", "--bind"])]
    assert thaw_invocations("thaw run/checkpoint/restore") == [("run", []), ("checkpoint", []), ("restore", [])]
    assert thaw_invocations('thaw() { sudo .venv/bin/thaw "$@"; }') == []
    assert thaw_invocations("helm install thaw deploy/helm/thaw -n thaw-system") == []
    assert thaw_invocations("thaw bench store") == [("bench", [])]   # and the test above would fail on it


def test_the_readme_is_a_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text.encode()) <= 15 * 1024, len(text.encode())
    assert "BEGIN config keys" not in text   # the table lives in docs/configuration.md only
    for section in ("## Two commands", "## Results", "## Try it", "## A GPU node", "## Kubernetes",
                    "## Command line", "## Configuration", "## Limitations"):
        assert section in text, section


_REPO_PATH = re.compile(r"^(control|runsc_hooks|nvproxy|ci|bench|tests|deploy|docs|go|proto)/[\w./-]+"
                        r"\.(py|sh|md|go|yaml|json|proto|c)$")


def named_paths(doc) -> list[str]:
    """Repository paths a doc names in code (`control/node/provision.py`), for the check below."""
    _, code = _prose_and_code(doc)
    return [t for span in code for t in (w.strip("`'\".") for w in re.split(r"[\s,;:()]+", span))
            if _REPO_PATH.match(t)]


def test_every_file_the_current_docs_name_exists():
    """No doc names a module from before the move into packages (control/daemon.py ...)."""
    missing = [f"{doc.relative_to(REPO)}: {p}" for doc in CURRENT for p in named_paths(doc)
               if not (REPO / p).exists() and not (doc.parent / p).exists()]
    assert not missing, "\n".join(missing)


def test_named_paths_finds_a_module_path(tmp_path):
    (tmp_path / "d.md").write_text("the daemon (`control/daemon.py`) and ``ci/setup.sh``\n")
    assert named_paths(tmp_path / "d.md") == ["control/daemon.py", "ci/setup.sh"]
