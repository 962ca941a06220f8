"""AdmissionReview documents (``admission.k8s.io/v1``) in and out.

``parse_review`` turns the document the API server POSTs into a ``Request`` or raises
``MalformedReview`` carrying whatever of the envelope it could read, so that even a broken
request is answered with its own uid and apiVersion. ``Response.to_document`` writes the reply
exactly as the API server expects it: uid echoed, JSONPatch base64-encoded, warnings.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kernelbake.admission.frozen import fast_init
from kernelbake.contract import jsondoc
from kernelbake.errors import BadInput

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
KIND = "AdmissionReview"
# The API server truncates longer warnings; keep ours readable whole.
MAX_WARNING = 256


class Operation(enum.Enum):
    """The API server's operation under review (``request.operation``)."""

    CREATE = "CREATE"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    CONNECT = "CONNECT"


@fast_init
@dataclasses.dataclass(frozen=True)
class GroupKind:
    """An object's API group and kind (``request.kind`` less the version): what picks its pod spec."""

    group: str
    kind: str

    def __str__(self) -> str:
        return f"{self.group}/{self.kind}" if self.group else self.kind


@fast_init
@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    """The parts of an AdmissionReview's ``request`` admission reads."""

    api_version: str
    uid: str
    kind: GroupKind
    operation: Operation
    sub_resource: str
    namespace: str
    name: str
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None
    dry_run: bool
    user: str


class MalformedReview(BadInput):
    """The document is not an AdmissionReview we can act on. Answered with a denial (code 400)
    echoing the uid and apiVersion when they could be read."""

    def __init__(self, message: str, *, uid: str = "", api_version: str = API_VERSIONS[0]) -> None:
        super().__init__(message)
        self.uid = uid
        self.api_version = api_version


def parse_review(doc: Any) -> Request:
    # Documents come from json.loads: objects are dicts, and checking for dict (not the
    # Mapping ABC) here and in the modules that read the object is a measurable share of a
    # cached review.
    if not isinstance(doc, dict):
        raise MalformedReview(f"an AdmissionReview is a JSON object, got {_json_type(doc)}")
    api_version = doc.get("apiVersion")
    request = doc.get("request")
    uid = request.get("uid") if isinstance(request, dict) else None
    echo_uid = uid if isinstance(uid, str) else ""
    echo_version = api_version if api_version in API_VERSIONS else API_VERSIONS[0]

    def bad(message: str) -> MalformedReview:
        return MalformedReview(message, uid=echo_uid, api_version=echo_version)

    if api_version not in API_VERSIONS:
        raise bad(f"apiVersion {api_version!r} is not {API_VERSIONS[0]}")
    if doc.get("kind") != KIND:
        raise bad(f"kind {doc.get('kind')!r} is not {KIND}")
    if not isinstance(request, dict):
        raise bad("the AdmissionReview has no request object")
    if not isinstance(uid, str) or not uid:
        raise bad("request.uid is missing")
    kind = _group_kind(request, bad)
    operation = _operation(request, bad)
    obj, old = _objects(request, operation, bad)
    user_info = request.get("userInfo")
    user = user_info.get("username", "") if isinstance(user_info, dict) else ""
    return Request(
        api_version=api_version,
        uid=uid,
        kind=kind,
        operation=operation,
        sub_resource=_str(request.get("subResource")),
        namespace=_str(request.get("namespace")),
        name=_str(request.get("name")),
        object=obj,
        old_object=old,
        dry_run=request.get("dryRun") is True,
        user=_str(user),
    )


def _group_kind(request: dict[str, Any], bad: Callable[[str], MalformedReview]) -> GroupKind:
    kind = request.get("kind")
    if not isinstance(kind, dict) or not isinstance(kind.get("kind"), str) or not kind.get("kind"):
        raise bad("request.kind must be an object with group, version and kind")
    group = kind.get("group", "")
    if not isinstance(group, str):
        raise bad("request.kind.group must be a string")
    return GroupKind(group, kind["kind"])


def _operation(request: dict[str, Any], bad: Callable[[str], MalformedReview]) -> Operation:
    try:
        return Operation(request.get("operation"))
    except ValueError:
        raise bad(
            f"request.operation {request.get('operation')!r} is not one of "
            f"{', '.join(o.value for o in Operation)}"
        ) from None


def _objects(
    request: dict[str, Any], operation: Operation, bad: Callable[[str], MalformedReview]
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The object and the old object: JSON objects where given, the object always for a
    CREATE or UPDATE."""
    obj, old = request.get("object"), request.get("oldObject")
    for field, value in (("object", obj), ("oldObject", old)):
        if value is not None and not isinstance(value, dict):
            raise bad(f"request.{field} must be an object, got {_json_type(value)}")
    if operation in (Operation.CREATE, Operation.UPDATE) and obj is None:
        raise bad(f"request.object is missing for a {operation.value}")
    return obj, old


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "a number"
    )


class Code(enum.IntEnum):
    BAD_REQUEST = 400
    FORBIDDEN = 403
    # The image could not be checked in time or the registry failed: say so, not "forbidden".
    # A bug of ours: still an answer, never a crash.
    INTERNAL = 500
    UNAVAILABLE = 503

    @property
    def reason(self) -> str:
        return {400: "BadRequest", 403: "Forbidden", 500: "InternalError", 503: "ServiceUnavailable"}[
            self.value
        ]


@fast_init
@dataclasses.dataclass(frozen=True, kw_only=True)
class Response:
    uid: str
    allowed: bool
    api_version: str = API_VERSIONS[0]
    code: Code | None = None
    message: str = ""
    patch: Sequence[Mapping[str, Any]] = ()
    warnings: Sequence[str] = ()

    @classmethod
    def malformed(cls, exc: MalformedReview) -> Response:
        return cls(
            uid=exc.uid,
            api_version=exc.api_version,
            allowed=False,
            code=Code.BAD_REQUEST,
            message=f"kernelbake admission: malformed AdmissionReview: {exc.message}",
        )

    def to_document(self) -> dict[str, Any]:
        response: dict[str, Any] = {"uid": self.uid, "allowed": self.allowed}
        if not self.allowed:
            code = self.code or Code.FORBIDDEN
            response["status"] = {
                "status": "Failure",
                "code": int(code),
                "reason": code.reason,
                "message": self.message,
            }
        if self.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(jsondoc.compact(list(self.patch)).encode()).decode()
        if self.warnings:
            response["warnings"] = [_clip(w) for w in self.warnings]
        return {"apiVersion": self.api_version, "kind": KIND, "response": response}


def _clip(text: str) -> str:
    return text if len(text) <= MAX_WARNING else text[: MAX_WARNING - 1] + "…"
