"""`gdr topo` and `gdr info` as data, on the committed sysfs fixtures (no GPU needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import gdr

from conftest import fixtures_dir

FIX = fixtures_dir()
needs_fixtures = pytest.mark.skipif(FIX is None, reason="topology fixtures not found")


def pairs(t):
    return {(p["a_name"], p["b_name"]): (p["path"], p["verdict"]) for p in t["pairs"]}


@needs_fixtures
def test_topo_gives_each_pair_its_path_class_and_verdict():
    t = gdr.topo(sysfs=str(FIX / "two-socket"))
    assert [d["label"] for d in t["devices"]][:4] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    p = pairs(t)
    assert p[("gpu0", "mlx5_0")] == ("PIX", "good")
    assert p[("gpu0", "gpu1")] == ("NODE", "works-slower")
    assert p[("gpu0", "gpu2")] == ("SYS", "poor-or-unsupported")
    for pair in t["pairs"]:
        assert pair["reasons"], pair


@needs_fixtures
def test_topo_sees_switches_and_acs():
    assert pairs(gdr.topo(sysfs=str(FIX / "nested-switch")))[("gpu0", "gpu1")] == ("PIX", "good")
    # ACS redirects peer traffic up to the root complex: no pair there is good.
    acs = gdr.topo(sysfs=str(FIX / "iommu-acs"))
    assert {v for _, v in pairs(acs).values()} == {"poor-or-unsupported"}


@needs_fixtures
def test_topo_all_shows_every_endpoint():
    path = str(FIX / "h100")
    gpu_view = gdr.topo(sysfs=path)
    assert [d["label"] for d in gpu_view["devices"]] == ["GPU0", "NET0"]
    assert len(gdr.topo(sysfs=path, all=True)["devices"]) >= 2
    assert gdr.topo(sysfs=str(FIX / "dev-vm-no-gpu"))["pairs"] == []


@needs_fixtures
def test_topo_explain_walks_one_path():
    e = gdr.topo_explain("gpu0", "gpu1", sysfs=str(FIX / "h200x2"))
    assert (e["class"], e["verdict"]) == ("PHB", "works-slower")
    assert e["hops"] and e["reasons"]
    with pytest.raises(ValueError):
        gdr.topo_explain("gpu0", "nosuchdevice", sysfs=str(FIX / "h200x2"))


def test_topo_of_a_missing_tree_raises_gdr_error(tmp_path):
    with pytest.raises(gdr.GdrError):
        gdr.topo(sysfs=str(tmp_path / "nothing-here"))


def test_topo_of_this_machine_is_data():
    try:
        t = gdr.topo()
    except gdr.GdrError as e:  # a container without /sys/bus/pci
        pytest.skip(f"no PCI tree here: {e}")
    assert isinstance(t["devices"], list) and isinstance(t["pairs"], list)


def test_info_accounts_for_every_library():
    info = gdr.info()
    for have, err in (
        ("cuda_driver", "cuda_error"),
        ("nvml_driver", "nvml_error"),
        ("nvrtc", "nvrtc_error"),
        ("vulkan_loader", "vulkan_loader_error"),
        ("gdrdrv", "gdrdrv_error"),
    ):
        assert (info[have] is not None) or (info[err] is not None), have
    assert isinstance(info["missing"], list) and isinstance(info["gpus"], list)


# Run in a child: a container marker and an ICD file that does not exist, as in a container
# started without the NVIDIA container toolkit's `graphics` capability.
_NO_ICD_CHILD = """
import json, gdr
i = gdr.info()
raised = None
try:
    g = gdr.open(0)
except gdr.UnavailableError:
    pass  # no GPU here
else:
    try:
        g.alloc(64).close()
        raised = "allocated"
    except gdr.UnavailableError as e:
        raised = str(e)
keys = ("container", "vulkan_loader", "vulkan_icd_error", "gpus", "missing")
print(json.dumps(dict({k: i[k] for k in keys}, raised=raised)))
"""


def test_without_the_icd_a_container_is_told_the_capability():
    env = dict(os.environ, container="podman", VK_DRIVER_FILES="/nonexistent/nvidia_icd.json")
    env.pop("VK_ICD_FILENAMES", None)
    out = subprocess.run([sys.executable, "-c", _NO_ICD_CHILD], env=env, capture_output=True,
                         text=True, check=True)
    i = json.loads(out.stdout)
    assert i["container"] == "container=podman"
    if i["vulkan_loader"] is None:
        # No loader here: the loader is what is missing, and the ICD is not asked about.
        assert i["vulkan_icd_error"] is None
        return
    err = i["vulkan_icd_error"]
    assert err.startswith("no NVIDIA Vulkan driver (ICD) found: "), err
    assert "this is a container (container=podman)" in err
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility,graphics" in err
    assert "VK_DRIVER_FILES" in err
    assert any(err in m for m in i["missing"]), i["missing"]
    if i["gpus"]:
        # On a GPU: the exception of the first allocation says the same.
        assert i["raised"] is not None and "NVIDIA_DRIVER_CAPABILITIES" in i["raised"], i["raised"]
