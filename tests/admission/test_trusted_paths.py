"""A pod spec cannot move what ``kernelbake serve`` trusts (issue 32, item 4): a container of a
governed image, of any kind, that mounts at or above target.json or the pinned manifest, or
sets a variable that moved them, is denied; the cache root's own volume is not."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kernelbake.admission.admit import Endpoint
from kernelbake.admission.pod import normal
from kernelbake.admission.rules.trusted_paths import NAMESPACE
from tests.admission import documents
from tests.admission.fakes import REPO, FakeVerifier, make_admitter, make_policy

TAG = f"{REPO}:h100"
TARGET = "/opt/kernelbake/target.json"
PINNED = "/opt/kernelbake/pinned-manifest.json"
BOTH = f"{TARGET} and {PINNED}"
DELTA = "/opt/kernelbake/delta"
FIX = "mount nothing at or above them (a cache volume belongs at /opt/kernelbake/cache)"
TRUSTS = "which kernelbake serve trusts as the signed image's own"


def answer(verifier: FakeVerifier, doc: Any, endpoint: Endpoint = Endpoint.MUTATE, **policy: Any) -> Any:
    out = make_admitter(verifier, make_policy(**policy) if policy else None).review(doc, endpoint)
    return out["response"]


def _pod(field: str = "containers", image: str = TAG, **container: Any) -> dict[str, Any]:
    """The pod-create request, with a container of ``field`` running ``image`` given the
    ``container`` fields (the first container itself for ``containers``)."""
    doc = documents.load("pod-create", TAG)
    spec = documents.pod_spec(doc)
    spec["volumes"].append({"name": "attack", "emptyDir": {}})
    if field == "containers" and image == TAG:
        spec["containers"][0].update(container)
    else:
        spec.setdefault(field, []).append({"name": "extra", "image": image, **container})
    return doc


def _mount(path: str) -> dict[str, Any]:
    return {"volumeMounts": [{"name": "attack", "mountPath": path}]}


def _denied(verifier: FakeVerifier, doc: Any) -> str:
    for endpoint in Endpoint:
        response = answer(verifier, doc, endpoint)
        assert response["allowed"] is False, response
        assert response["status"]["code"] == 403
    message: str = response["status"]["message"]
    return message


@pytest.mark.parametrize(
    ("field", "where"),
    [
        ("containers", 'container "vllm"'),
        ("initContainers", 'init container "extra"'),
        ("ephemeralContainers", 'ephemeral container "extra"'),
    ],
)
def test_a_volume_over_the_trusted_directory_is_denied_in_every_container_kind(
    verifier: FakeVerifier, field: str, where: str
) -> None:
    message = _denied(verifier, _pod(field, **_mount("/opt/kernelbake")))
    assert message == (
        f"kernelbake admission: {where}: volumeMounts[0] ('attack') at '/opt/kernelbake' covers {BOTH}, "
        f"{TRUSTS}; {FIX}"
    )


@pytest.mark.parametrize(
    ("path", "covers"),
    [
        ("/opt/kernelbake/", BOTH),
        ("//opt//kernelbake", BOTH),
        ("/opt/cache/../kernelbake/.", BOTH),
        ("opt/kernelbake", BOTH),
        ("/opt", BOTH),
        ("/", BOTH),
        (PINNED, PINNED),
        ("/opt/kernelbake//pinned-manifest.json/", PINNED),
        (TARGET, TARGET),
    ],
)
def test_every_spelling_of_a_path_at_or_above_a_trusted_file_is_denied(
    verifier: FakeVerifier, path: str, covers: str
) -> None:
    message = _denied(verifier, _pod(**_mount(path)))
    assert f"at {path!r} covers {covers}, {TRUSTS}" in message


def test_a_device_over_the_pinned_manifest_is_denied(verifier: FakeVerifier) -> None:
    doc = _pod(volumeDevices=[{"name": "attack", "devicePath": PINNED}])
    assert f"volumeDevices[0] ('attack') at {PINNED!r} covers {PINNED}" in _denied(verifier, doc)


@pytest.mark.parametrize(
    "path",
    [
        "/opt/kernelbake/cache",
        "/opt/kernelbake/cache/",
        "/opt/kernelbake/cache/inductor",
        "/opt/kernelbake-x",
        "/data",
    ],
)
def test_mounts_beside_the_trusted_files_are_admitted(verifier: FakeVerifier, path: str) -> None:
    """The cache root's volume is a documented recipe: the pinned manifest lies outside it."""
    assert answer(verifier, _pod(**_mount(path)))["allowed"] is True


def test_an_image_volume_at_the_cache_root_is_still_admitted(verifier: FakeVerifier, keys: Any) -> None:
    cache = f"{REPO.rsplit('/', 1)[0]}/qwen3-0.6b-cache:h100"
    verifier.add(cache, keys["h100"])
    doc = documents.add_image_volume(documents.load("pod-create", TAG), cache)
    assert answer(verifier, doc)["allowed"] is True


@pytest.mark.parametrize("name", ["KERNELBAKE_TARGET", "KERNELBAKE_UNSAFE_TARGET"])
@pytest.mark.parametrize("field", ["containers", "initContainers", "ephemeralContainers"])
def test_a_variable_that_moves_the_trusted_files_is_denied(
    verifier: FakeVerifier, name: str, field: str
) -> None:
    doc = _pod(field, env=[{"name": "HF_HOME", "value": "/x"}, {"name": name, "value": "/evil/target.json"}])
    message = _denied(verifier, doc)
    assert f"env sets {name}, which moves the files kernelbake serve trusts" in message


def test_the_manifest_digest_and_other_variables_are_admitted(verifier: FakeVerifier) -> None:
    env = [{"name": "KERNELBAKE_MANIFEST_DIGEST", "value": "sha256:" + "0" * 64}, {"name": "X", "value": "1"}]
    assert answer(verifier, _pod(env=env))["allowed"] is True


@pytest.mark.parametrize(
    ("prefix", "denied"),
    [
        (None, True),
        ("", True),
        ("KERNELBAKE_", True),
        # Issue 41 item 3: a prefix that none of the listed variables started with, but that
        # makes KERNELBAKE_VERIFY (=unsafe-size-only) from a key "Y" of the ConfigMap.
        ("KERNELBAKE_VERIF", True),
        ("K", True),
        ("APP_", False),
        ("KERNELBAKEX", False),
    ],
)
def test_env_from_that_could_set_a_variable_of_the_runtime_is_denied(
    verifier: FakeVerifier, prefix: str | None, denied: bool
) -> None:
    source: dict[str, Any] = {"configMapRef": {"name": "settings"}}
    if prefix is not None:
        source["prefix"] = prefix
    doc = _pod(envFrom=[source])
    if not denied:
        assert answer(verifier, doc)["allowed"] is True
        return
    assert (
        f"envFrom[0] (configMapRef, prefix {prefix or ''!r}) cannot be inspected here and could set "
        "KERNELBAKE_* variables, which kernelbake serve trusts"
    ) in _denied(verifier, doc)


def test_the_namespace_holds_every_variable_the_runtime_reads() -> None:
    """Asked of the runtime's own table rather than listed here: a variable it adds outside
    the namespace fails this test, not a review."""
    from kernelbake.runtime.env import VARIABLES

    outside = {v.name for v in VARIABLES if not v.name.startswith(NAMESPACE)}
    # TMPDIR (the scratch folder's fallback) and HF_TOKEN (fetch-model) move nothing serve trusts.
    assert outside == {"TMPDIR", "HF_TOKEN"}


@pytest.mark.parametrize(
    "name", ["KERNELBAKE_VERIFY", "KERNELBAKE_MANIFEST_DIGEST", "KERNELBAKE_DELTA_DIGEST"]
)
def test_a_variable_of_the_runtime_listed_twice_or_from_value_from_is_denied(
    verifier: FakeVerifier, name: str
) -> None:
    twice = [
        {"name": name, "value": "sha256"},
        {"name": "X", "value": "1"},
        {"name": name, "value": "unsafe"},
    ]
    message = _denied(verifier, _pod(env=twice))
    assert f"env lists {name!r} 2 times; Kubernetes gives the container the last" in message
    hidden = [{"name": name, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
    message = _denied(verifier, _pod("initContainers", env=hidden))
    assert (
        f'init container "extra": env[0] takes {name!r} from valueFrom, which admission cannot read'
        in message
    )


def test_other_variables_may_repeat_and_come_from_value_from(verifier: FakeVerifier) -> None:
    env = [
        {"name": "HF_HOME", "value": "/a"},
        {"name": "HF_HOME", "value": "/b"},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    assert answer(verifier, _pod(env=env))["allowed"] is True


@pytest.mark.parametrize("field", ["containers", "initContainers", "ephemeralContainers"])
@pytest.mark.parametrize(
    ("mount", "why"),
    [
        ({"mountPath": f"{DELTA}/delta.json", "subPath": "delta.json"}, f"lies inside {DELTA}"),
        ({"mountPath": f"{DELTA}/triton/k", "subPath": "k"}, f"lies inside {DELTA}"),
        ({"mountPath": DELTA}, f"only the image volume of a signed cache delta may be mounted at {DELTA}"),
        ({"mountPath": "/opt/kernelbake//delta/"}, "only the image volume of a signed cache delta"),
    ],
)
def test_a_mount_at_or_inside_the_delta_root_is_denied_in_every_container_kind(
    verifier: FakeVerifier, field: str, mount: dict[str, str], why: str
) -> None:
    doc = _pod(field, volumeMounts=[{"name": "attack", **mount}])
    assert why in _denied(verifier, doc)


def test_a_container_of_an_ungoverned_image_is_not_judged(verifier: FakeVerifier) -> None:
    doc = _pod(
        "containers", image="docker.io/library/busybox:1", env=[{"name": "KERNELBAKE_TARGET", "value": "/x"}]
    )
    documents.pod_spec(doc)["containers"][1].update(_mount("/opt/kernelbake"))
    assert answer(verifier, doc)["allowed"] is True


def test_warn_mode_admits_and_says_what_it_would_deny(verifier: FakeVerifier) -> None:
    response = answer(verifier, _pod(**_mount("/opt")), mode="warn")
    assert response["allowed"] is True
    assert any(
        w.startswith(
            "kernelbake (warn mode) would deny: container \"vllm\": volumeMounts[0] ('attack') at '/opt'"
        )
        for w in response["warnings"]
    )


def test_the_message_stays_bounded_however_large_the_spec(verifier: FakeVerifier) -> None:
    long = "/opt/" + "x/../" * 4000 + "kernelbake"
    mounts = [{"name": "attack" * 1000, "mountPath": long} for _ in range(5000)]
    env = [{"name": "KERNELBAKE_TARGET", "value": "/x"}] * 5000
    message = _denied(verifier, _pod(volumeMounts=mounts, env=env))
    assert len(message.encode()) < 4096
    # 5,000 mounts, 5,000 variables and the variable's repetition, 8 of them listed.
    assert message.endswith(
        "; 9993 more mounts or variables of the pod would move what kernelbake serve trusts"
    )


def test_a_malformed_mount_list_is_a_bad_request(verifier: FakeVerifier) -> None:
    response = answer(verifier, _pod(volumeMounts={"name": "attack", "mountPath": "/opt"}))
    assert response["allowed"] is False and response["status"]["code"] == 400
    assert "containers[0].volumeMounts must be a list of objects" in response["status"]["message"]


def test_the_request_is_not_changed_by_the_review(verifier: FakeVerifier) -> None:
    doc = _pod(**_mount("/opt/kernelbake"))
    before = copy.deepcopy(doc)
    answer(verifier, doc)
    assert doc == before


@pytest.mark.parametrize(
    ("written", "resolved"),
    [
        ("/", "/"),
        ("//", "/"),
        ("///opt", "/opt"),
        ("a/../../b/", "/b"),
        ("/opt/./kernelbake//", "/opt/kernelbake"),
    ],
)
def test_paths_are_normalised_as_written(written: str, resolved: str) -> None:
    assert normal(written) == resolved
