"""Shared set-up for the hvd Python tests.

Every rank runs the same pytest session (hvdrun -np N /usr/bin/python3 -m pytest ...), so the
tests run in the same order everywhere and every test calls the same collectives on every rank:
nothing here may skip or branch on the rank around a collective. Expected values come from
formulas or from a float64 NumPy reference computed locally from every rank's input, never from
the code under test.
"""

import numpy as np
import pytest

import hvd


@pytest.fixture(scope="session", autouse=True)
def engine():
    hvd.init()
    yield
    hvd.shutdown()


def world():
    return hvd.rank(), hvd.size()


def pattern(shape, r, kind="small"):
    """Rank r's input as float64: small non-negative integers, exact in every dtype.

    kind "small": (index % 5) + r, at most 4 + (size - 1).
    kind "prod":  1 + (index + r) % 2, so a product over 3 ranks stays <= 8.
    kind "avg":   (index % 5) + 3 + c_r with c_r summing to 0 over ranks, so the average is
                  the integer (index % 5) + 3 for any world size.
    kind "bool":  (index + r) % 2.
    """
    n = int(np.prod(shape)) if len(shape) else 1
    idx = np.arange(n, dtype=np.float64)
    if kind == "small":
        values = idx % 5 + r
    elif kind == "prod":
        values = 1 + (idx + r) % 2
    elif kind == "avg":
        size = hvd.size()
        values = idx % 5 + 3 + (-(size - 1) * size / 2 if r == 0 else r)
    elif kind == "bool":
        values = (idx + r) % 2
    else:
        raise ValueError(kind)
    return values.reshape(shape)
