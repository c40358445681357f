"""Test configuration: puts ``tests/helpers.py`` on the import path (``from helpers import ...``)
and gives every test its own seeded random generator.

Run the suite without a GPU with ``NUMBA_ENABLE_CUDASIM=1`` (read when numba.cuda is first
imported, so it must be set in the environment, not here).
"""
import os
import sys
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

#: Set NUMBA_MLA_SEED to draw different data; by default each test's data is fixed by its id,
#: so a failure reproduces.
BASE_SEED = int(os.environ.get("NUMBA_MLA_SEED", "0"))


@pytest.fixture
def rng(request):
    seed = zlib.crc32(request.node.nodeid.encode()) ^ BASE_SEED
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)
