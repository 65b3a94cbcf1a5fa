"""A small training that is not carbonflow's: it reads its work from carbonflow's variables, reports
progress, and records on which GPUs (by UUID) and when it ran, so the test can check GPU ownership."""

import json
import os
import time
from pathlib import Path

from carbonflow import training

steps = int(os.environ["CARBONFLOW_STEPS"])
batch = int(os.environ.get("CARBONFLOW_BATCH_SIZE") or 32)
started = time.time()
for step in range(1, steps + 1):
    time.sleep(0.05)
    training.report(step, step * batch, loss=1.0 / step)
    if training.should_stop():
        break
training.report(step, step * batch, test_accuracy=0.97)
Path(os.environ["CARBONFLOW_OUTPUT_DIR"]).mkdir(parents=True, exist_ok=True)
spans = os.environ.get("E2E_SPANS_FILE")
if spans:
    line = {
        "job": os.environ["CARBONFLOW_JOB"],
        "mode": os.environ["CARBONFLOW_MODE"],
        "start": started,
        "end": time.time(),
        "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
        "pid": os.getpid(),
    }
    with open(spans, "a") as handle:
        handle.write(json.dumps(line) + "\n")
