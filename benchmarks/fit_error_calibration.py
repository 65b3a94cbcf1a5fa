"""Refit the shipped forecast-error calibration (``carbonflow/carbon/data/error_calibration.json``).

    python benchmarks/fit_error_calibration.py [--neso-long FILE] [--carboncast FILE] [--out FILE]

NESO GB national: the 91 evening issues of 14 March - 24 June 2023 in ``benchmarks/data/neso-gb-published-2023``
(implausible published actuals left out); the former 4-issue fit is kept under ``superseded``. CarbonCast CISO:
every run the shared data set holds (8 daily runs, 1-8 July 2021; CarbonCast's Germany files are not in
``/work/shared/data``). Rerunnable: the output depends only on the input files.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from carbonflow.carbon.calibration import main

if __name__ == "__main__":
    main()
