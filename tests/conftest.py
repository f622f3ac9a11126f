"""Shared test set-up: keep torch and BLAS to one thread on these 2-core machines."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
