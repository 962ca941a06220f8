"""Issues 36 and 42 in CI: bench/capture_cpu.py end to end on the default image the fixtures
build (tiny-llama on vLLM's CPU build, with this tree's kernelbake inside): a replica compiles for
a request class the warm-up does not cover and is then poisoned (a line appended to a module
Inductor compiled); serve notes the class as the engine compiles for it, and ``capture
record``/``rebuild``/``push``/``verify`` turn that into a delta
rebuilt from the image, signed, in the test registry; a new replica with the delta mounted serves
the class without compiling; the poisoned bytes are in no delta that verifies (the rebuilt one
has the clean bytes; the replica's own is refused at push without the unsafe flag, and by verify
under the default policy with it), and each bad delta is refused. The bench's exit code says whether all of
that held; its JSON says what was seen, and is asserted here field by field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelbake.pipeline import Built
from tests.conftest import REPO
from tests.support.registry import free_port

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.slow]


def test_a_captured_delta_serves_the_next_replica_without_compiling(
    vllm_image: Built, tmp_path: Path
) -> None:
    assert vllm_image.pushed is not None
    out = tmp_path / "capture.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run(
        [
            sys.executable, str(REPO / "bench" / "capture_cpu.py"), "--image", vllm_image.pushed,
            "--port", str(free_port()), "--out", str(out),
        ],
        capture_output=True, text=True, env=env, timeout=1800,
    )  # fmt: skip
    assert out.is_file(), done.stderr[-4000:]
    doc = json.loads(out.read_text())
    summary = doc["summary"]
    assert doc["runtime"] == "the image's own kernelbake, as built"
    assert summary["first_replica_compiled_for_the_class"] > 0, doc["first_replica"]
    # The class the rebuild replayed is the one serve noted as it compiled, not one named to it.
    assert summary["record_served_waves"] >= 1 and summary["record_operator_waves"] == 0, doc["record"]
    assert any(c["body"].get("logprobs") == 20 for c in doc["record_noted"]["classes"]), doc["record_noted"]
    assert summary["delta_files"] > 0 and doc["verification"]["verified"] is True
    assert "merged into the caches" in summary["next_replica_start"], doc["next_replica"]["serve"]
    assert summary["next_replica_compiled_for_the_class"] == 0, doc["next_replica"]
    assert doc["next_replica"]["status_delta"]["used"] is True
    assert summary["refused"] == dict.fromkeys(
        (
            "tampered_file",
            "unpinned_digest",
            "base_mismatch",
            "overwrites_baked_file",
            "foreign_key",
            "replica_signed_push",
            "replica_signed_verify",
        ),
        True,
    ), doc["refused"]
    # Rebuilt by the trusted build, attested as such, tagged for this base alone.
    assert summary["delta_origin"] == "rebuilt" and doc["verification"]["origin"] == "rebuilt"
    assert doc["push"]["tagged"].endswith(":delta-" + vllm_image.pushed.split("@")[1].replace(":", "-"))
    assert "(rebuilt by " in summary["next_replica_start"]
    # The poisoned module: named, and the delta holds what the image compiles, not the replica's.
    poisoned = doc["poisoned_replica"]
    assert poisoned["named_as_other_bytes"] is True, doc["rebuild"]
    assert poisoned["poisoned_sha256"] not in (None, poisoned["clean_sha256"])
    assert poisoned["poisoned_sha256_in_delta"] is False, poisoned
    assert summary["poisoned_bytes_in_rebuilt_delta"] is False
    assert doc["next_replica"]["poison_ran"] is False
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
