"""The platform as the key names it."""

from __future__ import annotations

import dataclasses

from kernelbake.catalogue import Build, load_catalogue
from kernelbake.contract.key import CacheKey
from kernelbake.contract.platform import Platform, Software, arch_for


def test_arch_names_follow_the_compute_capability() -> None:
    assert arch_for((9, 0)) == "sm_90a"
    assert arch_for((12, 0)) == "sm_120a"
    assert arch_for((8, 6)) == "sm_86"


def test_the_catalogue_names_every_gpu_arch_as_a_probe_does() -> None:
    for gpu in load_catalogue().gpus.values():
        if not gpu.is_cpu:
            major, minor = gpu.compute_capability.split(".")
            assert gpu.arch == arch_for((int(major), int(minor))), gpu.name


def test_platform_fields_are_the_keys_measured_fields_in_its_order_with_the_installed_driver() -> None:
    names = Platform.field_names()
    assert names[-1] == "driver" and "driver" not in CacheKey.field_order()
    order = CacheKey.field_order()
    measured = [order.index(n) for n in names[:-1]]
    assert measured == sorted(measured)
    assert {f.name for f in dataclasses.fields(Software)} < set(order)
    software = Software(engine_version="1", torch="2", triton="3", cuda="4", flashinfer="5", python="6")
    platform = Platform(software=software, arch="sm_90a", device="NVIDIA H200", driver="580.1")
    assert list(platform.fields()) == list(names)
    assert platform.fields()["torch"] == "2" and platform.fields()["driver"] == "580.1"


def test_an_engine_release_ships_the_software_its_key_records() -> None:
    from kernelbake.contract.key import Engine

    release = load_catalogue().engine(Engine.VLLM, "0.26.0", Build.CUDA, where="test")
    assert release.version == release.software.engine_version == "0.26.0"
    assert release.software.cuda == "13.0" and release.base_image.endswith(":v0.26.0")
