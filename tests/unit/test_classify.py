import pytest

from workers.runner import classify_run_error


@pytest.mark.parametrize("msg,cls", [
    ("RPCRunner: Timeout, killed after 21 seconds", "device_lost"),
    ("RPCRunner: An exception occurred\nConnectionResetError: [Errno 104] reset by peer",
     "device_lost"),
    ("RPCRunner: An exception occurred\nRuntimeError: Cannot request cpu-local after 5 retry",
     "device_lost"),
    ("RPCRunner: An exception occurred\nTVMError: RPCSessionTimeoutError: timeout", "timeout"),
    ("RPCRunner: An exception occurred\nTVMError: Assert fail: buffer misaligned", "runtime"),
])
def test_classify_run_error(msg, cls):
    assert classify_run_error(msg) == cls
