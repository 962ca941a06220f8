"""Guides as runbooks (issue 44): the shell blocks of a page, run in page order by one runner,
with the output the page shows checked against what the commands print.

The marking convention, an HTML comment on the line before a fenced block (GitHub hides it):

    <!-- runbook -->                  run this block
    <!-- runbook: needs=gpu -->       not run: it needs what CI lacks (gpu, api-server, cluster,
                                      gpu-builder, registry-login); named in the report
    <!-- runbook: server -->          not run: it serves until stopped (the test that runs it is
                                      named on the page or in tests/integration/test_docs_run.py)
    <!-- runbook: synopsis -->        not run: usage lines, not commands
    <!-- runbook: given -->           not run: the runner starts from what it leaves (``make image``:
                                      the integration fixtures build the same image; ``make test``)
    <!-- runbook: elsewhere=NAME -->  not run here: tests/integration/NAME.py runs it (the README's
                                      quick start, a server and the requests sent to it)
    <!-- runbook: same=PAGE -->       not run here: the same commands run in a block of PAGE (a page
                                      in PAGES), which the parse checks, comments aside
    <!-- runbook: output -->          a plain block: what the run block before it prints; its lines
                                      must appear in that order (``…`` is any text, a number any number)

Other words in the comment are tags that other tests select blocks by (``quick-start``,
``commands``): ``<!-- runbook: commands -->``. Every ``sh`` block of a runbook page carries a
marker, so a new block is either run or says why not; an unmarked one fails the parse.

Blocks run with ``bash -e -o pipefail`` and ``set -a``: a failing command fails the block, and an
assignment (``IMAGE=$(cat build/image.ref)``) reaches the blocks after it, as in one terminal;
so does a ``cd``.
"""

from __future__ import annotations

import enum
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path


class Kind(enum.Enum):
    RUN = "run"
    NEEDS = "needs"
    SERVER = "server"
    SYNOPSIS = "synopsis"
    GIVEN = "given"
    ELSEWHERE = "elsewhere"
    SAME = "same"
    OUTPUT = "output"


# What CI lacks, each with the reason the report gives.
NEEDS = {
    "gpu": "needs a GPU",
    "gpu-builder": "needs a GPU builder",
    "api-server": "needs a Kubernetes API server",
    "cluster": "needs a Kubernetes cluster",
    "registry-login": "needs a registry of your own",
    "sigstore": "needs a Sigstore instance and an OIDC identity",
}


TESTS_ELSEWHERE = "tests/integration"
_REPO = Path(__file__).resolve().parents[2]


# The guides that are runbooks (issue 44), in the order a new user reads them.
PAGES = (
    "README.md",
    "docs/building.md",
    "docs/signing.md",
    "docs/serving.md",
    "docs/capture.md",
    "docs/cluster.md",
    "docs/snapshot.md",
    "docs/admission.md",
)


class RunbookError(AssertionError):
    """A page that does not parse as a runbook, or a block that failed or printed other output."""


@dataclass(frozen=True, kw_only=True)
class Block:
    page: str
    line: int  # of the opening fence, 1-based
    kind: Kind
    body: str
    tags: tuple[str, ...] = ()
    # needs=: what CI lacks; elsewhere=: the test that runs it; same=: the page that runs it.
    needs: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def skipped_because(self) -> str:
        if self.kind is Kind.NEEDS:
            return NEEDS[self.needs]
        if self.kind is Kind.ELSEWHERE:
            return f"run by {TESTS_ELSEWHERE}/{self.needs}.py"
        if self.kind is Kind.SAME:
            return f"the same commands run in {self.needs}"
        return {
            Kind.SERVER: "serves until stopped",
            Kind.SYNOPSIS: "usage lines, not commands",
            Kind.GIVEN: "the runner starts from what it leaves",
            Kind.OUTPUT: "what the block before it prints, which is not run here",
        }.get(self.kind, "")


_FENCE = re.compile(r"^```(\w*)\s*$")
_MARK = re.compile(r"^<!--\s*runbook(?::\s*(?P<words>[^>]*?))?\s*-->\s*$")
_SHELL = {"sh", "bash", "console", "shell"}


def _kind(words: list[str], where: str) -> tuple[Kind, str, tuple[str, ...]]:
    kinds = {w for w in words if w in ("server", "synopsis", "given", "output")}
    valued = [tuple(w.split("=", 1)) for w in words if w.startswith(("needs=", "elsewhere=", "same="))]
    tags = tuple(w for w in words if w not in kinds and "=" not in w)
    if len(kinds) + len(valued) > 1:
        raise RunbookError(f"{where}: a runbook marker says one thing: {' '.join(words)!r}")
    if not valued:
        return (Kind(kinds.pop()) if kinds else Kind.RUN), "", tags
    key, value = valued[0]
    if key == "needs" and value not in NEEDS:
        raise RunbookError(f"{where}: needs={value} is not one of {', '.join(NEEDS)}")
    if key == "elsewhere" and not (_REPO / TESTS_ELSEWHERE / f"{value}.py").is_file():
        raise RunbookError(f"{where}: elsewhere={value}: there is no {TESTS_ELSEWHERE}/{value}.py")
    if key == "same" and value not in PAGES:
        raise RunbookError(f"{where}: same={value} is not a runbook page ({', '.join(PAGES)})")
    return Kind(key), value, tags


def commands(body: str) -> list[list[str]]:
    """A block's commands as words: comments dropped, continuation lines joined."""
    joined = re.sub(r"\\\n\s*", " ", body)
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


def check_same(block: Block, pages: Mapping[str, str]) -> None:
    """A ``same=PAGE`` block's commands are those of one block PAGE runs (``pages``: page text
    by name); refused by line otherwise, so that skipping it never drops a command."""
    wanted = commands(block.body)
    ran = [b for b in parse(pages[block.needs], block.needs) if b.kind is Kind.RUN]
    if not any(all(c in commands(b.body) for c in wanted) for b in ran):
        raise RunbookError(
            f"{block.where}: same={block.needs}, but no block that {block.needs} runs has these commands: "
            f"{[' '.join(c) for c in wanted]}"
        )


def parse(text: str, page: str) -> list[Block]:
    """Every marked block of the page in order; an unmarked shell block is refused by line."""
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start = i
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise RunbookError(f"{page}:{start + 1}: a fenced block that never closes")
        prev = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        mark = _MARK.match(prev.strip())
        lang = fence.group(1)
        where = f"{page}:{start + 1}"
        if mark:
            kind, needs, tags = _kind((mark.group("words") or "").split(), where)
            if (kind is Kind.OUTPUT) == (lang in _SHELL):
                raise RunbookError(f"{where}: an output block is a plain fence, a run block a sh fence")
            body = "\n".join(lines[start + 1 : end]) + "\n"
            out.append(Block(page=page, line=start + 1, kind=kind, body=body, tags=tags, needs=needs))
        elif lang in _SHELL:
            raise RunbookError(
                f"{where}: a {lang} block without a runbook marker: put <!-- runbook --> before it, "
                f"or <!-- runbook: needs=… -->, server or synopsis to say why it is not run"
            )
        i = end + 1
    return out


def shown_line(text: str) -> re.Pattern[str]:
    """A line as the docs show it: ``…`` is any text, a number is any number."""
    parts = re.split(r"(…|\d+(?:\.\d+)?)", text)
    return re.compile(
        "".join(
            ".*" if p == "…" else r"\d+(?:\.\d+)?" if p and p[0].isdigit() else re.escape(p) for p in parts
        )
    )


def missing_lines(shown: str, printed: str) -> list[str]:
    """The shown lines not found, in order, among the printed ones (blank shown lines aside)."""
    lines = iter(printed.splitlines())
    missing = []
    for want in (ln for ln in shown.splitlines() if ln.strip()):
        pattern = shown_line(want.strip())
        if not any(pattern.fullmatch(ln.strip()) for ln in lines):
            missing.append(want)
            lines = iter(printed.splitlines())
    return missing


@dataclass(kw_only=True)
class Report:
    ran: list[Block] = field(default_factory=list)
    skipped: list[Block] = field(default_factory=list)
    checked: list[Block] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"ran {b.where}" for b in self.ran] + [
            f"skipped {b.where}: {b.skipped_because()}" for b in self.skipped
        ]


def _run_block(block: Block, env: dict[str, str], cwd: Path, timeout: float) -> tuple[str, dict[str, str]]:
    with tempfile.NamedTemporaryFile(prefix="kb-runbook-env-") as dump:
        script = f"set -a\n{block.body}\nenv -0 > {dump.name}\n"
        try:
            done = subprocess.run(
                ["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", "-c", script],
                cwd=cwd,
                env=env,
                # One stream, as a terminal shows it: a page's shown output interleaves both.
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            said = exc.stdout or b""
            text = said.decode(errors="replace") if isinstance(said, bytes) else said
            raise RunbookError(
                f"{block.where}: the block did not finish in {timeout:.0f} s:\n{block.body}\n"
                f"--- it printed:\n{text[-4000:]}"
            ) from None
        printed = done.stdout
        if done.returncode != 0:
            raise RunbookError(
                f"{block.where}: the block failed (exit {done.returncode}); the page and the code "
                f"disagree:\n{block.body}\n--- it printed:\n{printed[-4000:]}"
            )
        raw = Path(dump.name).read_bytes().decode()
    after = dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)
    return printed, after


def run(blocks: list[Block], *, env: Mapping[str, str], cwd: Path, timeout: float = 900.0) -> Report:
    """Run the blocks in order in ``cwd``, each seeing the variables and directory the one before
    left; check each output block against the run block before it."""
    report = Report()
    state = {**env, "PWD": str(cwd)}
    printed: str | None = None
    previous: Block | None = None
    for block in blocks:
        if block.kind is Kind.OUTPUT and previous is not None and previous.kind is not Kind.RUN:
            # What a block not run here prints: the test that runs it checks it.
            report.skipped.append(block)
            continue
        if block.kind is Kind.OUTPUT:
            if printed is None or previous is None:
                raise RunbookError(f"{block.where}: shown output that follows no block that ran")
            missing = missing_lines(block.body, printed)
            if missing:
                raise RunbookError(
                    f"{block.where}: the page shows lines that {previous.where} does not print: "
                    f"{missing}\n--- it printed:\n{printed[-4000:]}"
                )
            report.checked.append(block)
            continue
        printed = None
        previous = block
        if block.kind is not Kind.RUN:
            report.skipped.append(block)
            continue
        printed, state = _run_block(block, state, Path(state.get("PWD", cwd)), timeout)
        previous = block
        report.ran.append(block)
    return report


def page_env(bin_dir: Path, extra: Mapping[str, str]) -> dict[str, str]:
    """The environment a runbook starts with: this one, the venv's bin first on PATH (the README's
    set-up line), and what the caller stands in for."""
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", **extra}
