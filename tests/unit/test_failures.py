"""What a user reads of a failed candidate (farm/core/failures.py) and when a job failed
(farm/jobs/finalize.py: unmeasured)."""

from __future__ import annotations

from farm.core.failures import brief, fix_for
from farm.core.messages import JobSpec
from farm.jobs.finalize import unmeasured
from farm.store import TaskState

RPC_ERROR = """RPCRunner: An exception occurred
Traceback (most recent call last):
  File "/site-packages/tvm/s_tir/meta_schedule/runner/rpc_runner.py", line 389, in _worker_func
    rt_mod: Module = f_upload_module(session, local_path, remote_path)
                     ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/work/workers/metaschedule/phonelog.py", line 104, in upload_module
    return default_upload_module(session, local_path, remote_path)
tvm.error.RPCError: Error caught from RPC call:
  File "/workspace/tvm/src/runtime/rpc/rpc_endpoint.cc", line 410
  0: tvm::ffi::Module::LoadFromFile
RuntimeError: Failed to load dynamic shared library /tmp/x/cand.so /tmp/x/cand.so: wrong ELF class: ELFCLASS64
"""


def test_brief_keeps_the_phones_words_and_drops_the_traceback():
    got = brief(RPC_ERROR)
    assert got.endswith("wrong ELF class: ELFCLASS64"), got
    assert "Traceback" not in got and 'File "' not in got and "RPCRunner" not in got
    assert "^^^" not in got and "f_upload_module" not in got  # a frame's source line
    assert len(brief(RPC_ERROR, limit=40)) <= 40
    assert brief("") == "" and brief("plain words") == "plain words"
    assert "cannot load the library" in fix_for("runtime", got)


def _job(*wks: str) -> JobSpec:
    return JobSpec(job_id="j", model="m", device_key="k", target={"kind": "llvm"},
                   trials_per_task=4, round_trials=4, workload_keys=list(wks),
                   task_names={w: f"task-{w}" for w in wks}, weights=dict.fromkeys(wks, 1))


def test_a_job_fails_only_when_no_task_that_went_to_the_phones_got_a_valid_result():
    failed = TaskState(state="done", failures={"runtime": 3}, errors={"runtime": "no ELF"})
    lost = TaskState(state="done", device_lost=5, errors={"device_lost": "gone"})
    good = TaskState(state="done", valid=1, failures={"runtime": 1})
    cached = TaskState(state="done", message="from store (64 trials)")
    v = unmeasured(_job("a", "b", "c"), {"a": failed, "b": lost, "c": cached})
    assert v.nothing and v.tasks == ["task-a", "task-b"] and v.searched == 2
    assert (v.error_class, v.error) == ("device_lost", "gone")  # 5 lost > 3 runtime
    v = unmeasured(_job("a", "b"), {"a": failed, "b": good})
    assert not v.nothing and v.tasks == ["task-a"]  # named, but the job stands
    v = unmeasured(_job("c"), {"c": cached})  # nothing went to the phones: not a failure
    assert not v.nothing and v.searched == 0


def test_a_phone_gpus_errors_get_their_own_fixes():
    over = ("RPCRunner: An exception occurred\nError caught from RPC call:\nCheck failed: "
            "(e == 0) is false: OpenCL Error, code=-54: CL_INVALID_WORK_GROUP_SIZE")
    assert "limits" in fix_for("runtime", brief(over), key="mali")
    assert "farm doctor --tracker HOST:PORT --device-key mali" in fix_for("runtime", over, "mali")
    built = "OpenCL build error for device=0x1\n<kernel>:3:1: error: unknown type name 'vxid'"
    assert "OpenCL compiler refused" in fix_for("runtime", brief(built))
    none = ("Library binary was created using {opencl} but a loader of that name is not "
            "registered. Make sure to have runtime that registers ffi.Module.load_from_bytes.opencl")
    assert "has no OpenCL" in fix_for("runtime", brief(none))
