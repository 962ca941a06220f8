"""The platform as the key names it."""

from __future__ import annotations

from kernelbake.catalogue import CPU, load_catalogue
from kernelbake.contract.platform import arch_for


def test_arch_names_follow_the_compute_capability() -> None:
    assert arch_for((9, 0)) == "sm_90a"
    assert arch_for((12, 0)) == "sm_120a"
    assert arch_for((8, 6)) == "sm_86"


def test_the_catalogue_names_every_gpu_arch_as_a_probe_does() -> None:
    for gpu in load_catalogue().gpus.values():
        if gpu.name != CPU:
            major, minor = gpu.compute_capability.split(".")
            assert gpu.arch == arch_for((int(major), int(minor))), gpu.name
