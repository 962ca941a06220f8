"""An option whose values are an Enum's wire strings (``cli.building._add_choice``)."""

from __future__ import annotations

import argparse

import pytest

from kernelbake.cli.building import _add_choice
from kernelbake.render import BuildMode


def test_an_enum_option_parses_the_wire_strings_and_names_them() -> None:
    p = argparse.ArgumentParser(prog="x")
    _add_choice(p, "--mode", BuildMode.SINGLE, "how to build")
    assert p.parse_args([]).mode is BuildMode.SINGLE
    assert p.parse_args(["--mode", "two-phase"]).mode is BuildMode.TWO_PHASE
    assert "--mode {single,two-phase}" in p.format_help()
    with pytest.raises(SystemExit):
        p.parse_args(["--mode", "three-phase"])
