"""`make test-fast` deselects by marker: a test using a tool's fixture without the marker fails
collection (tests/conftest.py), rather than reaching for Docker or a registry there."""

from __future__ import annotations

from typing import Any, cast

import pytest

from tests.conftest import pytest_collection_modifyitems


class _Item:
    def __init__(
        self, fixtures: list[str], markers: tuple[str, ...] = (), params: dict[str, Any] | None = None
    ):
        self.nodeid = f"t::{'-'.join(fixtures)}"
        self.fixturenames = fixtures
        self._markers = markers
        if params is not None:
            self.callspec = type("CallSpec", (), {"params": params})()

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self._markers else None


def _check(*items: _Item) -> None:
    pytest_collection_modifyitems(cast(pytest.Config, None), cast(list[pytest.Item], list(items)))


def test_an_unmarked_use_of_a_tool_fixture_fails_collection() -> None:
    with pytest.raises(pytest.UsageError, match="uses the registry fixture but is not marked registry"):
        _check(_Item(["tmp_path", "registry"]))
    with pytest.raises(pytest.UsageError, match="sigstore_mock fixture but is not marked sigstore"):
        _check(_Item(["sigstore_mock", "registry"], markers=("registry",)))


def test_marked_uses_and_same_named_parameters_pass() -> None:
    _check(
        _Item(["registry", "cosign2"], markers=("registry", "cosign")),
        _Item(["registry"], params={"registry": "docker.io"}),
        _Item(["tmp_path"]),
    )
