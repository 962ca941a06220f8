"""Input files that never end, hang or nest without bound, through the real command line (a
separate process, with a timeout, so a hang fails the test instead of the suite); and output into
a reader that goes away (``| head -1``) ends quietly."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kernelbake import textfile
from kernelbake.cli import EXIT_BROKEN_PIPE
from kernelbake.validate import MAX_YAML_DEPTH, MAX_YAML_EXPANDED
from tests.conftest import REPO

KERNELBAKE = [sys.executable, "-m", "kernelbake"]
# Far more than any of these needs (they fail before any work); a hang or an unbounded read
# would not finish.
TIMEOUT = 60
_DIGEST = "sha256:" + "0" * 64


def _run(*args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*KERNELBAKE, *args], capture_output=True, text=True, timeout=TIMEOUT, stdin=stdin, check=False
    )


def _nul(p: Path) -> None:
    p.write_bytes(b"verify:\n  keys: [a.pub]\x00\n")


def _deep(p: Path) -> None:
    p.write_text("verify: " + "[" * 100_000 + "]" * 100_000 + "\n")


def _huge(p: Path) -> None:
    # 100 MB, sparse: what took 65 s to parse is now refused after reading the first MiB.
    with p.open("wb") as fh:
        fh.truncate(100_000_000)


BAD: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (lambda p: os.mkfifo(p), "a FIFO, not a regular file"),
    "dev-zero": (lambda p: p.symlink_to("/dev/zero"), "a character device, not a regular file"),
    "nul-byte": (_nul, "is not text (a NUL byte at offset 23)"),
    "nested-100000-deep": (_deep, f"YAML refused: nested deeper than {MAX_YAML_DEPTH} levels"),
    "100MB": (_huge, f"over the {textfile.MAX_INPUT_BYTES}-byte limit"),
}

COMMANDS: dict[str, Callable[[str], list[str]]] = {
    "plan": lambda f: ["plan", f],
    "admission check-policy": lambda f: ["admission", "check-policy", f],
    "verify --policy": lambda f: ["verify", f"127.0.0.1:1/kb/x@{_DIGEST}", "--policy", f, "--timeout", "1"],
}


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_file_that_hangs_never_ends_or_nests_deep_is_one_line_exit_2(
    command: str, bad: str, tmp_path: Path
) -> None:
    make, detail = BAD[bad]
    path = tmp_path / "input.yaml"
    make(path)
    argv = COMMANDS[command](str(path))
    done = _run(*argv)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"kernelbake {argv[0]}: error: {path}")
    assert detail in lines[0], lines[0]


def test_nesting_within_the_bound_is_read(tmp_path: Path) -> None:
    # The bound refuses depth, not documents: at the limit the policy is read, and fails for
    # what it says (a list of lists is no key), not for how it nests.
    path = tmp_path / "policy.yaml"
    path.write_text("verify:\n  keys: " + "[" * (MAX_YAML_DEPTH - 2) + "]" * (MAX_YAML_DEPTH - 2) + "\n")
    done = _run("admission", "check-policy", str(path))
    assert done.returncode == 2 and "nested deeper" not in done.stderr, done.stderr
    path.write_text("verify:\n  keys: " + "[" * (MAX_YAML_DEPTH - 1) + "]" * (MAX_YAML_DEPTH - 1) + "\n")
    done = _run("admission", "check-policy", str(path))
    assert f"nested deeper than {MAX_YAML_DEPTH} levels" in done.stderr, done.stderr


def _laughs() -> str:
    """A flow list of ~320 bytes that nine aliases per level expand to 9^9 (387 million) strings."""
    levels = ['&l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"&l{n} [" + ", ".join([f"*l{n - 1}"] * 9) + "]" for n in range(1, 9)]
    return "[" + ", ".join(levels) + "]"


# Each under a key whose validator quotes the value it refuses; the line is the bomb's.
BOMBS: dict[str, tuple[str, int, Callable[[str], list[str]]]] = {
    "policy images[1]": (
        "mode: enforce\nimages:\n  - 127.0.0.1:5000/kb/**\n  - {bomb}\nverify:\n  keys: [k.pub]\n",
        4,
        lambda f: ["admission", "check-policy", f],
    ),
    "spec serve.max_num_seqs (render)": (
        "name: x\nmodel: {{id: org/m, revision: '" + "0" * 40 + "'}}\n"
        "engine: {{name: vllm, version: '0.32.0'}}\nserve:\n  max_num_seqs: {bomb}\ntargets: [cpu]\n",
        5,
        lambda f: ["render", f],
    ),
    "spec serve.max_num_seqs (plan)": (
        "name: x\nmodel: {{id: org/m, revision: '" + "0" * 40 + "'}}\n"
        "engine: {{name: vllm, version: '0.32.0'}}\nserve:\n  max_num_seqs: {bomb}\ntargets: [cpu]\n",
        5,
        lambda f: ["plan", f],
    ),
    "verify policy identities[0].subject": (
        "identities:\n  - issuer: https://ci.example\n    subject: {bomb}\ntrusted_root: sigstore-public-good\n",
        3,
        COMMANDS["verify --policy"],
    ),
}


def _two_gib() -> None:
    # The expanded document took 5-5.8 GB before it was bounded: on a shared machine the old
    # behaviour ends in a MemoryError here, not in the host's OOM killer.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize("case", list(BOMBS))
def test_a_billion_laughs_under_a_quoted_key_is_refused_at_load(case: str, tmp_path: Path) -> None:
    text, line, command = BOMBS[case]
    path = tmp_path / "input.yaml"
    path.write_text(text.format(bomb=_laughs()))
    assert path.stat().st_size < 700
    argv = command(str(path))
    done = subprocess.run(
        [*KERNELBAKE, *argv],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
        check=False,
        preexec_fn=_two_gib,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == (
        f"kernelbake {argv[0]}: error: {path}:{line}: YAML refused: aliases expand the document past "
        f"{MAX_YAML_EXPANDED:,} values and characters (an alias names its anchor's whole value again); "
        "write the values out\n"
    )


_LONG = "A" * 200_000
# A value as long as a file may hold, where a validator (or the reference and host parsers
# behind it) quotes what it refuses: each quote is cut (validate.quoted).
LONG_VALUES: dict[str, tuple[str, Callable[[str], list[str]]]] = {
    "policy images[0]": (
        f"images:\n  - {_LONG}/x\nverify:\n  keys: [k.pub]\n",
        lambda f: ["admission", "check-policy", f],
    ),
    "policy unverified_registries[0]": (
        "images: [r.example/x]\nunlisted_registries: deny\n"
        f"unverified_registries:\n  - {_LONG.lower()}:99999\nverify:\n  keys: [k.pub]\n",
        lambda f: ["admission", "check-policy", f],
    ),
    "spec serve.dtype": (
        "name: x\nmodel: {id: org/m, revision: '" + "0" * 40 + "'}\n"
        f"engine: {{name: vllm, version: '0.32.0'}}\nserve:\n  dtype: {_LONG}\ntargets: [cpu]\n",
        lambda f: ["plan", f],
    ),
}


@pytest.mark.parametrize("case", list(LONG_VALUES))
def test_a_long_value_is_quoted_cut_in_one_short_line(case: str, tmp_path: Path) -> None:
    text, command = LONG_VALUES[case]
    path = tmp_path / "input.yaml"
    path.write_text(text)
    argv = command(str(path))
    done = _run(*argv)
    assert done.returncode == 2, done.stderr[:2000]
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"kernelbake {argv[0]}: error: {path}:") and "...' (200,0" in line
    assert len(line) < 2000, len(line)  # was 600,138 characters for the policy pattern


def test_a_request_on_stdin_is_read_within_the_body_limit() -> None:
    with Path("/dev/zero").open("rb") as zero:
        done = _run("admission", "review", "--policy", "unused.yaml", "-", stdin=zero.fileno())
    assert done.returncode == 2
    assert done.stderr.startswith("kernelbake admission: error: <stdin>: the AdmissionReview is over the ")


def _closed_reader(*args: str) -> tuple[int, str]:
    """Run with stdout a pipe whose reader has gone (``| head -1`` once head has its line)."""
    read, write = os.pipe()
    os.close(read)
    try:
        child = subprocess.run(
            [*KERNELBAKE, *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
    finally:
        os.close(write)
    return child.returncode, child.stderr


def test_plan_print_into_a_reader_that_went_away_ends_quietly() -> None:
    rc, err = _closed_reader("plan", "--print", str(REPO / "images" / "qwen3-8b.yaml"))
    assert (rc, err) == (EXIT_BROKEN_PIPE, "")


def test_admission_review_into_a_reader_that_went_away_ends_quietly(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "images: [r.example/**]\nverify:\n  identities: [{issuer: https://ci.example, subject: ci}]\n"
        "  trusted_root: sigstore-public-good\n"
    )
    request = tmp_path / "request.json"
    pod = {"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"name": "c", "image": "other/x:1"}]}}
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "object": pod,
        },
    }
    request.write_text(json.dumps(review))
    assert _run("admission", "review", "--policy", str(policy), str(request)).returncode == 0
    rc, err = _closed_reader("admission", "review", "--policy", str(policy), str(request))
    assert (rc, err) == (EXIT_BROKEN_PIPE, "")


def test_a_pipe_that_stays_open_is_written_whole() -> None:
    # The quiet exit is for a reader that left, not a change to normal output.
    done = _run("plan", "--print", str(REPO / "images" / "qwen3-8b.yaml"))
    assert done.returncode == 0 and json.loads(done.stdout)["targets"]


@pytest.mark.registry
def test_verify_json_into_a_reader_that_went_away_ends_quietly(registry: str, tmp_path: Path) -> None:
    from tests.admission import live

    key, pub = live.generate_key(tmp_path / "keys", "k")
    image = live.push_target(registry, "kernelbake/pipe", "h100", "h100", tmp_path / "img")
    live.sign(image, key)
    argv = ["verify", image.pinned, "--key", str(pub), "--json"]
    assert json.loads(_run(*argv).stdout)["verified"] is True
    rc, err = _closed_reader(*argv)
    assert (rc, err) == (EXIT_BROKEN_PIPE, "")


def test_what_the_machine_refuses_is_one_line_never_a_traceback() -> None:
    """An operating system error no module put in its own words (here a folder that cannot be
    made; on a CI machine, a disk that filled during ``snapshot push``) ends the command with
    what failed and where, exit 3."""
    done = _run("render", str(REPO / "images/tiny-llama.yaml"), "--gpu", "cpu", "--out", "/dev/null/out")
    assert done.returncode == 3
    assert done.stderr == "kernelbake render: error: [Errno 20] Not a directory: '/dev/null/out/wheels'\n"
