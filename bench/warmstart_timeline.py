"""The timeline of a start, rebuilt from an image-flow log archive when the bench's own JSON
is missing (a run cut at the device's time limit) or predates ``timeline_s``.

    python3 bench/warmstart_timeline.py bench/results/vllm-0.26.0-h200-warmstart/fork/tiny-llama-ref-logs.tar.gz

vLLM stamps its lines to the second; the launch is taken from the archive's file times: the
warm server starts right after ``kernelbake check`` wrote check.log, the cold one right after
the runtime stage wrote runtime-0.log (bench/vllm_image_flow.py). So each figure is good to
about a second, which is what the JSON says next to it.
"""

from __future__ import annotations

import json
import re
import sys
import tarfile
from datetime import datetime
from pathlib import Path
from typing import Any

# The bench's own marks: this rebuilds the timelines it records as it runs.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_image_flow import note_marks

STAMP = re.compile(r"^\((APIServer|EngineCore)[^)]*\) \w+ (\d\d-\d\d \d\d:\d\d:\d\d) ")
LAUNCHED_AFTER = {"serve-warm.log": "check.log", "serve-cold.log": "runtime-0.log"}


def timeline(archive: str) -> dict[str, Any]:
    out: dict[str, Any] = {"archive": archive, "resolution_s": 1}
    with tarfile.open(archive) as tar:
        members = {m.name.rsplit("/", 1)[-1]: m for m in tar.getmembers() if m.isfile()}
        for log, before in LAUNCHED_AFTER.items():
            if log not in members or before not in members:
                continue
            launch = datetime.fromtimestamp(members[before].mtime)
            fh = tar.extractfile(members[log])
            assert fh is not None
            marks: dict[str, float] = {}
            for line in fh.read().decode(errors="replace").splitlines():
                m = STAMP.match(line)
                if not m:
                    continue
                at = datetime.strptime(f"{launch.year}-{m.group(2)}", "%Y-%m-%d %H:%M:%S")
                note_marks(line, marks, round((at - launch).total_seconds(), 1))
            out[log.removesuffix(".log")] = {"launched_after": before, **marks}
    warm, cold = out.get("serve-warm", {}), out.get("serve-cold", {})
    if warm.get("api_server_listening") and cold.get("api_server_listening"):
        out["speedup_listening"] = round(cold["api_server_listening"] / warm["api_server_listening"], 2)
    return out


def main() -> int:
    for archive in sys.argv[1:]:
        print(json.dumps(timeline(archive), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
