"""Facts about the machine a run trains on: Python, platform, the torch build, the GPUs.

These facts decide whether an environment can be rebuilt elsewhere (a CUDA 12.8 torch build
needs a driver that speaks CUDA 12), and how to translate it to another card. They come from
the running interpreter and from NVML (``nvidia-ml-py``); every probe is optional, so a
CPU-only laptop gets ``gpu: null`` rather than an error. Nothing here reads environment
variables, so no value of one can end up in a lockfile.
"""

from __future__ import annotations

import contextlib
import platform
import re
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from burst.staging import spawn


@dataclass(frozen=True)
class Gpu:
    """The node's GPUs as NVML reports them (all assumed alike; the first one is named)."""

    name: str
    count: int
    compute_capability: str | None  # "9.0"
    driver: str | None  # "570.124.06"
    driver_cuda: str | None  # the newest CUDA the driver supports, "12.8"
    memory_bytes: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def python_facts() -> dict[str, str]:
    return {"version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "abi": f"cp{sys.version_info.major}{sys.version_info.minor}"}


def platform_facts() -> dict[str, str]:
    libc, libc_version = platform.libc_ver()
    return {"system": platform.system(), "machine": platform.machine(),
            "libc": f"{libc} {libc_version}".strip()}


def torch_variant(version: str, cuda: str | None = None, hip: str | None = None) -> str:
    """The build variant of a torch version: ``cpu``, ``cu128``, ``rocm6.4``, or
    ``default`` for a PyPI build that names none (macOS, Windows)."""
    local = version.partition("+")[2]
    if local:
        return local
    if cuda:
        major, _, minor = cuda.partition(".")
        return f"cu{major}{minor.split('.')[0]}"
    if hip:
        return "rocm" + ".".join(hip.split(".")[:2])
    return "default"


def torch_facts() -> dict[str, Any] | None:
    """The torch build in this interpreter, or None if torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    cuda = getattr(torch.version, "cuda", None)
    hip = getattr(torch.version, "hip", None)
    cudnn = None
    with contextlib.suppress(Exception):
        if torch.backends.cudnn.is_available():
            cudnn = str(torch.backends.cudnn.version())
    return {"version": torch.__version__, "variant": torch_variant(torch.__version__, cuda, hip),
            "cuda": cuda, "hip": hip, "cudnn": cudnn}


def detect_gpu() -> Gpu | None:
    """The node's NVIDIA GPUs through NVML, or None when there are none or no driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        return _read_nvml(pynvml)
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _read_nvml(pynvml: Any) -> Gpu | None:
    count = pynvml.nvmlDeviceGetCount()
    if count < 1:
        return None
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    name = _text(pynvml.nvmlDeviceGetName(handle))
    capability = driver = driver_cuda = memory = None
    with contextlib.suppress(Exception):
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        capability = f"{major}.{minor}"
    with contextlib.suppress(Exception):
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
    with contextlib.suppress(Exception):
        raw = int(pynvml.nvmlSystemGetCudaDriverVersion())
        driver_cuda = f"{raw // 1000}.{raw % 1000 // 10}"
    with contextlib.suppress(Exception):
        memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    return Gpu(name, count, capability, driver, driver_cuda, memory)


def nvidia_device_present() -> bool:
    """A second opinion when NVML fails: is there an NVIDIA GPU, driver or not? Device
    nodes (``/dev/nvidia*``), the driver's ``/proc`` entry, or an NVIDIA display/3D device
    on the PCI bus (sysfs, else ``lspci``): a GPU node without a working driver is an error,
    not a silent CPU install."""
    if any(Path("/dev").glob("nvidia[0-9]*")) or Path("/proc/driver/nvidia/version").exists():
        return True
    return _nvidia_on_pci()


_NVIDIA_VENDOR = "0x10de"


def _nvidia_on_pci() -> bool:
    devices = Path("/sys/bus/pci/devices")
    if devices.is_dir():
        for device in devices.iterdir():
            with contextlib.suppress(OSError):
                vendor = (device / "vendor").read_text().strip()
                klass = (device / "class").read_text().strip()
                if vendor == _NVIDIA_VENDOR and klass.startswith("0x03"):
                    return True
        return False
    lspci = shutil.which("lspci")
    if not lspci:
        return False
    with contextlib.suppress(OSError):  # spawn: may run in the freeze thread (see spawn)
        done = spawn.run([lspci, "-n"], timeout=20)
        return bool(re.search(rb"\b03[0-9a-f]{2}: 10de:", done.stdout))
    return False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_version(text: str) -> tuple[int, ...]:
    """Leading numeric release of a version string: ``"2.8.0+cu128"`` -> ``(2, 8, 0)``."""
    match = re.match(r"^\s*v?(\d+(?:\.\d+)*)", text or "")
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()
