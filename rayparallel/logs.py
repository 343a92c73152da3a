"""The keys rayparallel adds to an epoch's `logs` beside Keras' own, named once.

Workers add them (`worker/loop.py`), the driver's checks list them as keys a checkpoint's
`monitor` may name (`cluster/preflight.py`), and the console shows them in their own place
(`cluster/progress.py`); Keras' callbacks get Keras' keys only.
"""

from __future__ import annotations

THROUGHPUT = ("samples_per_s", "input_wait_fraction")  # every epoch
LOSS_SCALE = "loss_scale"  # with train.dtype_policy mixed_float16
OWN_KEYS = (*THROUGHPUT, LOSS_SCALE)
