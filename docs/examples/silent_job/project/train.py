"""A training that does its work but never tells carbonflow: no progress reports, so it cannot be profiled."""

import time

for _step in range(200):
    time.sleep(0.05)
print("trained without telling anyone")
