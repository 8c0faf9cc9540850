"""Peak memory of the current process, for the benchmarks."""


def peak_rss_mb() -> float:
    """VmHWM: this process's peak resident memory. (``ru_maxrss`` would also count the
    parent's peak from before ``exec``, which Linux carries over to the child.)"""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")
