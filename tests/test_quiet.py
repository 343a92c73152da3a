"""TensorFlow's native start-up notices are dropped, anything else is written back (pure logic)."""

from __future__ import annotations

from rayparallel.quiet import _kept

CAPTURED = """WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1796086165.475873   12775 port.cc:153] oneDNN custom operations are on.
I0000 00:00:1796086165.477149   12775 cudart_stub.cc:31] Could not find cuda drivers on your machine.
To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow.
E0000 00:00:1796086168.539597   12775 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)
/site-packages/keras/src/layer.py:12: UserWarning: a warning the user should see
E0000 00:00:1796086168.539597   12775 op_kernel.cc:1] a real TensorFlow error
"""


def test_only_known_start_up_notices_are_dropped():
    assert _kept(CAPTURED) == (
        "/site-packages/keras/src/layer.py:12: UserWarning: a warning the user should see\n"
        "E0000 00:00:1796086168.539597   12775 op_kernel.cc:1] a real TensorFlow error\n"
    )
