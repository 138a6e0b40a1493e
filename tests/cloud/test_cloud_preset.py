"""Issue #36: a profile that `up` or `run` writes gets the env preset of its GPU, as `sandbox up --gpu h100-sxm5`
gives its profile `env_preset: h100`: a rehearsal runs with the environment of the run it rehearses."""
from __future__ import annotations

from gpuops.cloud import api, decisions as d


def _type(name, desc, gpus=1):
    return api.InstanceType(name=name, gpu_description=desc, price_cents_per_hour=100, gpus=gpus)


def test_the_launched_gpu_names_its_preset_as_the_sandbox_does():
    from gpuops.sandbox.host import _preset
    from gpuops.sandbox.nvidia_smi import CATALOG

    assert d.launched_preset(_type("gpu_8x_h100_sxm5", "H100 (80 GB SXM5)", 8)) == "h100"
    assert d.launched_preset(_type("gpu_1x_h100_pcie", "H100 (80 GB PCIe)")) == "h100"
    assert d.launched_preset(_type("gpu_1x_h100_sxm5", "H100 (80 GB SXM5)")) == _preset(CATALOG["h100-sxm5"]["name"])
    assert d.launched_preset(_type("gpu_1x_a10", "A10 (24 GB PCIe)")) is None  # no preset for it in gpus.yaml
    assert d.launched_preset(_type("gpu_1x_mystery", "")) is None
