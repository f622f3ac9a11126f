"""Choosing a collective's algorithm: the cost model, measuring it, and ``algorithm="auto"``.

    cost_model    alpha-beta-gamma predictions of the algorithms, and their fitting
    measurement   timing candidates on a live group
    autotune      "auto": the cost model fitted to a group's transport picks the algorithm;
                  a group's state (``Tuner``), what each backend's communicator keeps
"""

from __future__ import annotations
