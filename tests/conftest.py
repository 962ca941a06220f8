from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.registry import running_registry

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``127.0.0.1:<port>`` of a real docker-registry for this test session."""
    with running_registry(tmp_path_factory.mktemp("registry")) as addr:
        yield addr
