"""The runbook runner (tests/support/runbook.py) on small pages: blocks run in order and share a
terminal's state, shown output is checked, a drift or a failing command fails, a block CI cannot
run is named, and a shell block nobody marked is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support import runbook
from tests.support.runbook import Kind, RunbookError

PAGE = """# A guide

<!-- runbook -->
```sh
GREETING=hello
mkdir sub && cd sub
```

<!-- runbook -->
```sh
echo "$GREETING from $(basename "$PWD")"
echo "took 0.25 s"
```

<!-- runbook: output -->
```
hello from sub
took 1.5 s
```

<!-- runbook: needs=gpu -->
```sh
nvidia-smi
```

<!-- runbook: server commands -->
```sh
sleep infinity
```

<!-- runbook: given -->
```sh
make image
```

<!-- runbook: elsewhere=test_docs_run -->
```sh
curl localhost:8000/health
```

```
not checked: a plain block without a marker
```
"""


def _run(text: str, tmp_path: Path) -> runbook.Report:
    blocks = runbook.parse(text, "guide.md")
    return runbook.run(blocks, env=runbook.page_env(tmp_path, {}), cwd=tmp_path, timeout=30)


def test_blocks_run_in_order_with_state_and_shown_output_checked(tmp_path: Path) -> None:
    report = _run(PAGE, tmp_path)
    assert [b.line for b in report.ran] == [4, 10]
    assert [b.line for b in report.checked] == [16]
    assert report.lines()[2:] == [
        "skipped guide.md:22: needs a GPU",
        "skipped guide.md:27: serves until stopped",
        "skipped guide.md:32: the runner starts from what it leaves",
        "skipped guide.md:37: run by tests/integration/test_docs_run.py",
    ]
    assert (tmp_path / "sub").is_dir()


def test_tags_select_blocks_and_kinds_are_read() -> None:
    blocks = runbook.parse(PAGE, "guide.md")
    assert [(b.kind, b.tags) for b in blocks][4] == (Kind.SERVER, ("commands",))
    assert blocks[3].needs == "gpu"


def test_output_that_drifts_from_the_page_fails_naming_the_line(tmp_path: Path) -> None:
    drifted = PAGE.replace("hello from sub", "hello from elsewhere")
    with pytest.raises(
        RunbookError, match=r"guide.md:16: the page shows lines that guide.md:10 does not print"
    ):
        _run(drifted, tmp_path)


def test_a_failing_command_fails_the_block(tmp_path: Path) -> None:
    failing = PAGE.replace('echo "took 0.25 s"', "false\necho never")
    with pytest.raises(RunbookError, match=r"guide.md:10: the block failed \(exit 1\)"):
        _run(failing, tmp_path)


def test_a_failing_command_in_a_pipe_fails_the_block(tmp_path: Path) -> None:
    failing = PAGE.replace('echo "took 0.25 s"', "false | cat")
    with pytest.raises(RunbookError, match=r"exit 1"):
        _run(failing, tmp_path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("```sh\nls\n```\n", r"guide.md:1: a sh block without a runbook marker"),
        ("<!-- runbook: needs=quantum -->\n```sh\nls\n```\n", r"needs=quantum is not one of gpu"),
        ("<!-- runbook: output -->\n```sh\nls\n```\n", r"an output block is a plain fence"),
        ("<!-- runbook -->\n```\nls\n```\n", r"an output block is a plain fence"),
        ("<!-- runbook: server needs=gpu -->\n```sh\nls\n```\n", r"says one thing"),
        ("<!-- runbook -->\n```sh\nls\n", r"never closes"),
        ("<!-- runbook: elsewhere=nowhere -->\n```sh\nls\n```\n", r"no tests/integration/nowhere.py"),
    ],
)
def test_a_page_that_is_not_a_runbook_is_refused_by_line(text: str, message: str) -> None:
    with pytest.raises(RunbookError, match=message):
        runbook.parse(text, "guide.md")


def test_shown_output_with_nothing_before_it_is_refused(tmp_path: Path) -> None:
    text = "<!-- runbook: output -->\n```\nhello\n```\n"
    with pytest.raises(RunbookError, match="follows no block that ran"):
        _run(text, tmp_path)


def test_shown_output_of_a_block_not_run_here_is_left_to_the_test_that_runs_it(tmp_path: Path) -> None:
    text = (
        "<!-- runbook: elsewhere=test_docs_run -->\n```sh\ncurl localhost:8000/health\n```\n\n"
        "<!-- runbook: output -->\n```\nnever printed here\n```\n\n"
        "<!-- runbook -->\n```sh\necho hello\n```\n\n<!-- runbook: output -->\n```\nhello\n```\n"
    )
    report = _run(text, tmp_path)
    assert [b.line for b in report.checked] == [17]
    assert report.lines()[1:] == [
        "skipped guide.md:2: run by tests/integration/test_docs_run.py",
        "skipped guide.md:7: what the block before it prints, which is not run here",
    ]


def test_shown_lines_match_with_ellipses_and_any_number() -> None:
    printed = "a\nverified x@sha256:abc: signed by key sha256:def; 12 files\nz\n"
    assert runbook.missing_lines("verified x@sha256:…: signed by key sha256:…; 3 files\n", printed) == []
    assert runbook.missing_lines("z\na\n", printed) == ["a"]


PAGE_TEXTS = {page: (REPO / page).read_text() for page in runbook.PAGES}


def test_every_page_with_shell_commands_is_a_runbook() -> None:
    """A page's shell blocks are run, or say why not, wherever the page is: docs/admission.md's
    `make admission-try` ran nowhere until it became one (2026-12-06)."""
    fence = re.compile(rf"^```(?:{'|'.join(sorted(runbook._SHELL))})\s*$", re.M)
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    with_commands = {str(p.relative_to(REPO)) for p in pages if fence.search(p.read_text())}
    assert with_commands and with_commands <= set(runbook.PAGES), with_commands - set(runbook.PAGES)


@pytest.mark.parametrize("page", runbook.PAGES)
def test_every_guide_is_a_runbook_with_blocks_to_run(page: str) -> None:
    blocks = runbook.parse(PAGE_TEXTS[page], page)
    assert any(b.kind is Kind.RUN for b in blocks), page
    # What a page leaves to another page's run is run there, command for command.
    for block in blocks:
        if block.kind is Kind.SAME:
            runbook.check_same(block, PAGE_TEXTS)


def test_a_block_left_to_another_page_must_be_run_there_command_for_command() -> None:
    same = '<!-- runbook: same=other.md -->\n```sh\ndocker run --rm "$IMAGE" check --json   # warm?\n```\n'
    (block,) = runbook.parse(same.replace("other.md", "docs/serving.md"), "guide.md")
    assert block.kind is Kind.SAME and block.skipped_because() == "the same commands run in docs/serving.md"
    other = '<!-- runbook -->\n```sh\nIMAGE=x\ndocker run --rm "$IMAGE" check --json\n```\n'
    runbook.check_same(block, {"docs/serving.md": other})
    with pytest.raises(RunbookError, match=r"guide.md:2: same=docs/serving.md, but no block"):
        runbook.check_same(block, {"docs/serving.md": other.replace("--json", "")})
    with pytest.raises(RunbookError, match=r"same=other\.md is not a runbook page"):
        runbook.parse(same, "guide.md")


def test_a_block_that_hangs_fails_naming_its_line(tmp_path: Path) -> None:
    text = "<!-- runbook -->\n```sh\necho started\nsleep 30\n```\n"
    blocks = runbook.parse(text, "guide.md")
    with pytest.raises(RunbookError, match=r"guide.md:2: the block did not finish in 1 s"):
        runbook.run(blocks, env=runbook.page_env(tmp_path, {}), cwd=tmp_path, timeout=1)


def test_shown_output_is_checked_in_the_order_a_terminal_shows_both_streams(tmp_path: Path) -> None:
    text = (
        "<!-- runbook -->\n```sh\necho 'an error' >&2\necho 'exit 3'\n```\n\n"
        "<!-- runbook: output -->\n```\nan error\nexit 3\n```\n"
    )
    assert len(_run(text, tmp_path).checked) == 1
