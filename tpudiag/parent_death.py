"""A child process of tpudiag (a compile or chip worker, the profiled program's wrapper) dies with
tpudiag: `die_with_parent` asks Linux to SIGKILL it when its parent goes (killed, terminal closed).
No tpudiag imports: the kernels' chip worker uses it too.
"""

from __future__ import annotations

import os
import signal
import sys


# The pid of the tpudiag process that started a worker, in the worker's environment
# (`capture.workers.popen` sets it).
PARENT_ENV = "TPUDIAG_PARENT_PID"


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (killed, terminal closed), so it is
    never left running alone; if the parent (`parent_pid`, else `PARENT_ENV`'s, where known) is
    already gone, stop now. The check matters: a tpudiag killed (kill -9) while its worker was still
    starting Python, before this call, left the worker running with no parent, compiling for
    minutes."""
    if parent_pid is None and os.environ.get(PARENT_ENV, "").isdigit():
        parent_pid = int(os.environ[PARENT_ENV])
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1  # <linux/prctl.h>
        try:
            ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(128 + signal.SIGKILL)
