"""The capture record: what a replica compiled that its image's build had not, for a trusted
build to compile again (``kernelbake capture record`` writes it, ``capture rebuild`` replays it).

A record holds no bytes anyone runs. It names:

- ``requests``: the request classes that missed the baked caches, as completion request bodies
  (the rebuild sends each once, to the image's own server, with fake weights);
- ``claims``: the files the replica's cache root gained, per kind with the engine's own keys
  (``contract.delta.engine_key``), path, size and sha256. They are the replica's word, compared
  with what the rebuild produces (how deterministic each kind is), never copied;
- ``key`` and ``base_manifest``: the image it was recorded on, which the rebuild must run.

Everything in a record is untrusted input: bounded here, and replayed only inside the image,
without network.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from kernelbake.contract.delta import DeltaFile, check, files_of, kinds_json
from kernelbake.contract.delta import DeltaManifest as _Shape
from kernelbake.contract.key import CacheKey, parse_key
from kernelbake.errors import BadInput

SCHEMA = 1
RECORD = "record.json"
# A record is replayed request by request on a builder: a few classes, each small.
MAX_REQUESTS = 64
MAX_REQUEST_BYTES = 64 << 10
MAX_RECORD_BYTES = 32 << 20
# The rebuild serves each class once; a long generation compiles nothing a short one does not.
MAX_TOKENS = 256


class InvalidRecord(BadInput, ValueError):
    """A capture record that is malformed or over its bounds; the message names the field."""


def request_problem(body: Any) -> str | None:
    """Why ``body`` cannot be replayed as a request class, or None."""
    if not isinstance(body, dict):
        return f"a request is a JSON object (a completion request's body), not {type(body).__name__}"
    if len(json.dumps(body)) > MAX_REQUEST_BYTES:
        return f"a request is at most {MAX_REQUEST_BYTES} B of JSON"
    tokens = body.get("max_tokens", 16)
    if not isinstance(tokens, int) or isinstance(tokens, bool) or not 0 < tokens <= MAX_TOKENS:
        return f"max_tokens {tokens!r} is not an integer from 1 to {MAX_TOKENS}"
    if body.get("stream") not in (None, False):
        return "stream must be false or absent (the rebuild reads whole answers)"
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaptureRecord:
    key: CacheKey
    base_manifest: str  # sha256:… of the pinned cache manifest of the image recorded on
    replica: str
    # Canonical JSON of each request body: hashable, and one encoding for one record.
    requests: tuple[str, ...]
    claims: tuple[DeltaFile, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "claims", tuple(sorted(self.claims, key=lambda f: f.path)))
        if len(self.requests) > MAX_REQUESTS:
            raise InvalidRecord(
                f"{len(self.requests)} requests, more than a record may hold ({MAX_REQUESTS})"
            )
        for i, text in enumerate(self.requests):
            if problem := request_problem(json.loads(text)):
                raise InvalidRecord(f"requests[{i}]: {problem}")
        # The claims obey a delta's invariants (paths in their kind, bounded), so that
        # comparing them with a rebuild's files is comparing like with like.
        check(_Shape(key=self.key, base_image=None, base_manifest=self.base_manifest, files=self.claims))

    @staticmethod
    def canonical(body: dict[str, Any]) -> str:
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(t) for t in self.requests]

    def to_json(self) -> str:
        doc = {
            "schema": SCHEMA,
            "key": str(self.key),
            "key_digest": self.key.digest,
            "base_manifest": self.base_manifest,
            "replica": self.replica,
            "requests": self.bodies(),
            "claims": kinds_json(self.claims),
        }
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.to_json().encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = RECORD) -> CaptureRecord:
        if len(text) > MAX_RECORD_BYTES:
            raise InvalidRecord(f"{source}: {len(text)} bytes, more than a capture record may hold")
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
                got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
                raise InvalidRecord(f"record schema {got!r} is not {SCHEMA}")
            requests = doc["requests"]
            if not isinstance(requests, list):
                raise InvalidRecord("requests must be a list")
            for i, body in enumerate(requests):
                if problem := request_problem(body):
                    raise InvalidRecord(f"requests[{i}]: {problem}")
            return cls(
                key=parse_key(doc["key"]),
                base_manifest=str(doc["base_manifest"]),
                replica=str(doc.get("replica", "")),
                requests=tuple(cls.canonical(b) for b in requests),
                claims=tuple(files_of(doc["claims"])),
            )
        except BadInput as exc:
            raise InvalidRecord(f"{source}: {exc}") from None
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidRecord(f"{source}: not a capture record ({type(exc).__name__}: {exc})") from None
