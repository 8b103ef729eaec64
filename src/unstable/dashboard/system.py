"""What the machine running the dashboard is doing: each GPU's use through NVML, else CPU and memory."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gauge:
    """One bar of the system panel: a name, a percentage and a detail such as '3.1 / 80.0 GiB'."""

    name: str
    percent: float
    detail: str = ""


GIB = 2**30


def gpu_gauges() -> list[Gauge]:
    """Utilisation and memory of every NVIDIA GPU; [] when NVML (or a GPU) is missing."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no pynvml, no driver or no GPU: the panel falls back to CPU and memory
        return []
    gauges = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        utilisation = pynvml.nvmlDeviceGetUtilizationRates(handle)
        gauges.append(Gauge(f"GPU {index} util", float(utilisation.gpu)))
        detail = f"{memory.used / GIB:.1f} / {memory.total / GIB:.1f} GiB"
        gauges.append(Gauge(f"GPU {index} mem", 100.0 * memory.used / memory.total, detail))
    pynvml.nvmlShutdown()
    return gauges


def cpu_gauges() -> list[Gauge]:
    """CPU use (over all cores, sampled for 0.1 s) and memory use of this machine."""
    import psutil

    memory = psutil.virtual_memory()
    return [
        Gauge(f"CPU x{psutil.cpu_count()}", psutil.cpu_percent(interval=0.1)),
        Gauge("memory", memory.percent, f"{memory.used / GIB:.1f} / {memory.total / GIB:.1f} GiB"),
    ]


def system_gauges() -> list[Gauge]:
    """GPU gauges when this machine has GPUs, else CPU and memory."""
    return gpu_gauges() or cpu_gauges()
