"""What Linux says of the memory an array lives in: the flags of its mapping in /proc/self/smaps."""
from pathlib import Path

import numpy as np

HUGE_PAGES = Path("/sys/kernel/mm/transparent_hugepage").is_dir()   # the kernel makes them at all


def vm_flags(a: np.ndarray) -> list[str]:
    """The VmFlags of the mapping holding the middle of `a` ("hg": advised for huge pages, "nh": against)."""
    middle = a.__array_interface__["data"][0] + a.nbytes // 2   # (NumPy advises from a 2 MB boundary on)
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    for i, line in enumerate(lines):
        span = line.split(" ", 1)[0].split("-")
        if len(span) == 2 and int(span[0], 16) <= middle < int(span[1], 16):
            return next(x for x in lines[i + 1:] if x.startswith("VmFlags:")).split()[1:]
    raise LookupError("the array's mapping is not in /proc/self/smaps")


def in_small_pages(a: np.ndarray) -> bool:
    """Whether `a` is kept from huge pages: not advised for them, and advised against where the kernel has them."""
    flags = vm_flags(a)
    return "hg" not in flags and ("nh" in flags or not HUGE_PAGES)
