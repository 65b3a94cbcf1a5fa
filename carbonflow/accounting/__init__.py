"""carbonflow's accounting: a run's energy, its splits, its emissions and its saving, in one place.

* :mod:`~carbonflow.accounting.energy`: each device's energy charged to a job (a shared device's part), one
  total per run with nothing counted twice, the shared-GPU split (``P_i × s_i``), a co-located pair's phases
  charged to its members and their sharing figures (the ``M_*`` metric names tracking's schema documents);
* :mod:`~carbonflow.accounting.emissions`: energy over time × the carbon intensity of that time;
* :mod:`~carbonflow.accounting.saving`: the one saving figure (realised here, predicted by the planner,
  which imports it from here: see that module for why);
* :mod:`~carbonflow.accounting.run`: what a wrapped run measured → its :class:`~carbonflow.domain.RunResult`.

Units come from :mod:`carbonflow.units` alone. Accounting imports neither the execution layer that calls it
nor the planner or tracking.
"""
