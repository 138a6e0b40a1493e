"""The emulated CUDA build of torch that an emulated instance image's system Python carries (stdlib only).

Lambda Stack images ship a CUDA torch in the system `python3`; a test machine has no GPU, so this module stands in
for it: installed as `torch/__init__.py` in the image's site-packages (sandbox/image.py), with the version and CUDA
of the image written into its first lines. It answers the calls gpuops' probe and a small training script make
(`torch.__version__`, `torch.version.cuda`, `torch.cuda.is_available/device_count/get_device_name/
get_device_capability/get_arch_list/synchronize/is_bf16_supported`, `torch.randn(..., device=...)`, `a @ b`,
`.sum().item()`, `torch.backends.cudnn.version()`), and learns its GPUs as the real one does from the driver: it
asks the (emulated) `nvidia-smi` on PATH, honouring CUDA_VISIBLE_DEVICES (indexes or UUID prefixes). With no driver,
`cuda.is_available()` is False, as with a real CUDA build on a host whose driver is not loaded; with a driver that
hangs (the sandbox's `hang` failure), it hangs, as CUDA's initialisation does.
It says what it is: `torch.EMULATED` is True.
"""
__version__ = "2.9.0+cu128"
CUDA = "12.8"

import os as _os
import subprocess as _subprocess

EMULATED = True


class version:
    cuda = CUDA
    git_version = "emulated"
    hip = None


class _C:
    _GLIBCXX_USE_CXX11_ABI = True


_devices_cache = None


def _devices():
    """[(index, name, capability)] of the GPUs this process may use."""
    global _devices_cache
    if _devices_cache is not None:
        return _devices_cache
    found = []
    try:
        # no time limit: on a driver that does not answer, CUDA's initialisation hangs as nvidia-smi does
        r = _subprocess.run(["nvidia-smi", "--query-gpu=index,name,compute_cap,uuid", "--format=csv,noheader"],
                            stdout=_subprocess.PIPE, stderr=_subprocess.PIPE)
        if r.returncode == 0:
            for line in r.stdout.decode().splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) >= 4 and parts[0].isdigit():
                    found.append((int(parts[0]), parts[1], parts[2], parts[3]))
    except (OSError, _subprocess.SubprocessError):
        found = []
    visible = _os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        chosen = []
        for item in (v.strip() for v in visible.split(",")):
            if not item:
                break  # CUDA stops at the first invalid entry
            match = [d for d in found if (item.isdigit() and d[0] == int(item)) or d[3].startswith(item)]
            if not match:
                break
            chosen.append(match[0])
        found = chosen
    _devices_cache = found
    return found


def _device_index(device):
    text = str(device if device is not None else "cpu")
    if text.startswith("cuda"):
        i = int(text.split(":", 1)[1]) if ":" in text else 0
        if not 0 <= i < len(_devices()):
            raise RuntimeError("CUDA error: invalid device ordinal")
        return i
    return None


class Tensor:
    def __init__(self, value, shape, device="cpu"):
        self._value, self.shape, self.device = float(value), tuple(shape), device

    def __matmul__(self, other):
        inner = self.shape[-1] if self.shape else 1
        return Tensor(self._value * other._value * inner, self.shape[:-1] + other.shape[1:], self.device)

    def sum(self):
        n = 1
        for s in self.shape:
            n *= s
        return Tensor(self._value * n, (), self.device)

    def item(self):
        return self._value

    def to(self, device):
        _device_index(device)
        return Tensor(self._value, self.shape, str(device))

    def cuda(self, i=0):
        return self.to("cuda:%d" % i)

    def __repr__(self):
        return "tensor(%r, device=%r)  # emulated" % (self._value, self.device)


def randn(*shape, device=None, **_):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    if device is not None and str(device).startswith("cuda") and not cuda.is_available():
        raise RuntimeError("Found no NVIDIA driver on your system.")
    _device_index(device)
    return Tensor(0.001, shape, str(device or "cpu"))


ones = zeros = randn


class cuda:
    @staticmethod
    def is_available():
        return bool(_devices())

    @staticmethod
    def device_count():
        return len(_devices())

    @staticmethod
    def get_device_name(i=0):
        return _devices()[i][1]

    @staticmethod
    def get_device_capability(i=0):
        major, _, minor = _devices()[i][2].partition(".")
        return int(major), int(minor or 0)

    @staticmethod
    def get_arch_list():
        return ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]

    @staticmethod
    def synchronize(i=None):
        return None

    @staticmethod
    def is_bf16_supported():
        return bool(_devices())

    @staticmethod
    def init():
        if not _devices():
            raise RuntimeError("Found no NVIDIA driver on your system.")

    @staticmethod
    def current_device():
        return 0

    @staticmethod
    def set_device(i):
        _device_index("cuda:%d" % int(i))


class _Cudnn:
    @staticmethod
    def version():
        return 91002

    @staticmethod
    def is_available():
        return True


class backends:
    cudnn = _Cudnn
