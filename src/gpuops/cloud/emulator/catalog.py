"""What the emulated Lambda account offers: instance types (names, descriptions and prices as on Lambda's public
price list, November 2025; gpu_8x_h100_sxm5gdr as the OpenAPI 1.8.3 InstanceType example gives it), regions (OpenAPI 1.8.3's PublicRegionCode enum) and images. Data only."""
from __future__ import annotations

REGIONS = {
    "us-east-1": "Virginia, USA", "us-east-2": "Washington DC, USA", "us-east-3": "Georgia, USA",
    "us-west-1": "California, USA", "us-west-2": "Arizona, USA", "us-west-3": "Utah, USA",
    "us-south-1": "Texas, USA", "us-south-2": "North Texas, USA", "us-south-3": "Central Texas, USA",
    "us-midwest-1": "Illinois, USA", "us-midwest-2": "Ohio, USA", "europe-central-1": "Germany",
    "asia-south-1": "India", "asia-northeast-1": "Osaka, Japan", "asia-northeast-2": "Tokyo, Japan",
    "australia-east-1": "Sydney, Australia", "me-west-1": "Israel",
}

# name -> (description, gpu_description, price_cents_per_hour, vcpus, memory_gib, storage_gib, gpus, sandbox GPU model)
TYPES = {
    "gpu_1x_h100_pcie": ("1x H100 (80 GB PCIe)", "H100 (80 GB PCIe)", 249, 26, 225, 1024, 1, "h100-pcie"),
    "gpu_1x_h100_sxm5": ("1x H100 (80 GB SXM5)", "H100 (80 GB SXM5)", 329, 26, 225, 2764, 1, "h100-sxm"),
    "gpu_2x_h100_sxm5": ("2x H100 (80 GB SXM5)", "H100 (80 GB SXM5)", 638, 52, 450, 5528, 2, "h100-sxm"),
    "gpu_8x_h100_sxm5": ("8x H100 (80 GB SXM5)", "H100 (80 GB SXM5)", 2392, 208, 1800, 22118, 8, "h100-sxm"),
    "gpu_8x_h100_sxm5gdr": ("8x H100 (80 GB SXM5)", "H100 (80 GB SXM5)", 3592, 208, 1800, 24780, 8, "h100-sxm"),
    "gpu_1x_a100_sxm4": ("1x A100 (80 GB SXM4)", "A100 (80 GB SXM4)", 179, 30, 225, 2845, 1, "a100"),
    "gpu_8x_a100_80gb_sxm4": ("8x A100 (80 GB SXM4)", "A100 (80 GB SXM4)", 1432, 240, 1800, 19500, 8, "a100"),
    "gpu_1x_a10": ("1x A10 (24 GB PCIe)", "A10 (24 GB PCIe)", 75, 30, 200, 1400, 1, "a10"),
    "gpu_1x_gh200": ("1x GH200 (96 GB)", "GH200 (96 GB)", 149, 64, 432, 4096, 1, "gh200"),
    "gpu_8x_b200_sxm6": ("8x B200 (180 GB SXM6)", "B200 (180 GB SXM6)", 3992, 208, 2900, 22118, 8, "b200"),
}

DEFAULT_REGIONS = ("us-east-1", "us-west-1")  # where every type has capacity after `sandbox up --cloud`
DEFAULT_SLOTS = 4

IMAGES = [
    ("lambda-stack-22-04", "Lambda Stack 22.04", "lambda-stack-22-04", "22.04", "x86_64"),
    ("lambda-stack-24-04", "Lambda Stack 24.04", "lambda-stack-24-04", "24.04", "x86_64"),
    ("ubuntu-24-04", "Ubuntu LTS", "ubuntu-lts", "24.04.01", "x86_64"),
    ("lambda-stack-24-04-arm64", "Lambda Stack 24.04 (GH200)", "lambda-stack-24-04", "24.04", "arm64"),
]


def instance_type(name: str) -> dict:
    desc, gdesc, cents, vcpus, mem, disk, gpus, _ = TYPES[name]
    return {"name": name, "description": desc, "gpu_description": gdesc, "price_cents_per_hour": cents,
            "specs": {"vcpus": vcpus, "memory_gib": mem, "storage_gib": disk, "gpus": gpus}}


def gpu_of(name: str) -> tuple[str, int]:
    """The sandbox GPU model and count a type's instances emulate."""
    t = TYPES[name]
    return t[7], t[6]


def available_types() -> list[str]:
    """Types whose GPU the sandbox can emulate (gh200/b200 appear once nvidia_smi's CATALOG has them)."""
    from ...sandbox.host import GPU_MODELS

    return [n for n, t in TYPES.items() if t[7] in GPU_MODELS]
