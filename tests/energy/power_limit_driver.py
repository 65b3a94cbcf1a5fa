"""A minimal wrapper-like process for fault-injection tests: applies a limit, runs a child, misbehaves on request.

Usage: python power_limit_driver.py LIMIT_W MODE   (MODE: exception | wait)
Prints ``APPLIED child=<pid>`` once the limit is set and the child runs.
"""

from __future__ import annotations

import signal
import subprocess
import sys

from carbonflow.energy.nvml import nvml_devices
from carbonflow.energy.power_limit import applied_power_limit


def main() -> int:
    # Ctrl-C is a KeyboardInterrupt even when SIGINT came ignored (a background job, as CI may run the tests);
    # the real wrapper installs its own SIGINT handler the same way
    signal.signal(signal.SIGINT, signal.default_int_handler)
    limit_w, mode = float(sys.argv[1]), sys.argv[2]
    devices = nvml_devices()
    child = None
    try:
        with applied_power_limit(devices, limit_w, retry_delay_s=0.01) as outcome:
            child = subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(60)"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            print(f"APPLIED child={child.pid} applied={outcome.applied}", flush=True)
            if mode == "exception":
                raise RuntimeError("training crashed")
            code = child.wait()
            print(f"CHILD EXITED {code}", flush=True)
    finally:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
